"""Emails are stored in their normal form (NFKC, then case folding), which the unique index
on ``email`` then keeps unique; the case-insensitive index it replaces compared with
PostgreSQL's idea of case, which is not Python's."""

import unicodedata

from django.db import migrations


def _normal_form(email: str) -> str:
    # Frozen copy of identity.emails.normalize_email as of this migration.
    folded = unicodedata.normalize("NFKC", email.strip()).casefold()
    return unicodedata.normalize("NFKC", folded).strip()


def normalize_emails(apps, schema_editor):
    User = apps.get_model("identity", "User")
    owners: dict[str, int] = {}
    clashes = []
    for user_id, email in User.objects.order_by("id").values_list("id", "email"):
        normal = _normal_form(email)
        if normal in owners:
            clashes.append((owners[normal], user_id, normal))
        owners.setdefault(normal, user_id)
    if clashes:
        listed = "; ".join(f"users {a} and {b} are both {e!r}" for a, b, e in clashes)
        raise RuntimeError(
            "Two users have emails that are the same address in normal form; change one "
            f"of each pair, then migrate again: {listed}."
        )
    for user_id, email in User.objects.values_list("id", "email"):
        normal = _normal_form(email)
        if normal != email:
            User.objects.filter(pk=user_id).update(email=normal)


class Migration(migrations.Migration):
    dependencies = [
        ("identity", "0003_refresh_token_password_changed"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="user",
            name="users_email_ci_key",
        ),
        migrations.RunPython(normalize_emails, migrations.RunPython.noop),
    ]
