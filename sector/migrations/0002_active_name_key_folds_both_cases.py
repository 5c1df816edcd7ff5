"""The unique index on active sectors' names compares ``lower(upper(name))``, the key the
pre-check (``sector_name_in_use``) compares too. It compared ``lower(name)`` while the
pre-check compared ``upper(name)``: they disagree on some letters (final sigma, dotless i),
and two sectors created at the same moment could both be active under one name."""

from django.db import migrations, models
from django.db.models.functions import Lower, Upper

CLASHES = """
    SELECT string_agg(id::text, ', ' ORDER BY id), min(name)
    FROM sectors
    WHERE is_active
    GROUP BY lower(upper(name))
    HAVING count(*) > 1
    ORDER BY min(id)
"""


def refuse_clashing_names(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(CLASHES)
        clashes = cursor.fetchall()
    if clashes:
        listed = "; ".join(f"sectors {ids} are all {name!r}" for ids, name in clashes)
        raise RuntimeError(
            "Active sectors share one name in different cases; rename or deactivate all "
            f"but one of each group, then migrate again: {listed}."
        )


class Migration(migrations.Migration):
    dependencies = [
        ("sector", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(refuse_clashing_names, migrations.RunPython.noop),
        migrations.RemoveConstraint(
            model_name="sector",
            name="sectors_active_name_key",
        ),
        migrations.AddConstraint(
            model_name="sector",
            constraint=models.UniqueConstraint(
                Lower(Upper("name")),
                condition=models.Q(is_active=True),
                name="sectors_active_name_key",
            ),
        ),
    ]
