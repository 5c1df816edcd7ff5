"""Print the figures of the last reliability run as the table docs/RELIABILITY.md shows.

.venv/bin/python -m tests.reliability.figures          # full run (make chaos)
.venv/bin/python -m tests.reliability.figures quick    # the quick form
"""

from __future__ import annotations

import json
import sys

from tests.reliability.support import FIGURES_DIR

COLUMNS = ("sent", "delivered", "duplicates", "lost", "recovery_seconds")
KNOWN = {*COLUMNS, "scenario", "mode", "recorded_at"}


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "full"
    rows = [json.loads(path.read_text()) for path in (FIGURES_DIR / mode).glob("*.json")]
    rows.sort(key=lambda row: row["scenario"])
    print("| scenario | sent | delivered | duplicates | lost | recovery | also measured |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        recovery = row["recovery_seconds"]
        others = "; ".join(
            f"{key}: {value:.2f}" if isinstance(value, float) else f"{key}: {value}"
            for key, value in row.items()
            if key not in KNOWN
        )
        print(
            f"| {row['scenario']} | {row['sent']} | {row['delivered']} | {row['duplicates']} "
            f"| {row['lost']} | {'-' if recovery is None else f'{recovery:.2f} s'} | {others} |"
        )


if __name__ == "__main__":
    main()
