"""Count which collected tests run on both databases, per directory (docs/testing.md's table).

    .venv/bin/python tests/count_databases.py

A test id with a `sqlite` parameter whose twin with `postgres` in its place is collected too is
a pair; a `sqlite` or `postgres` parameter without its twin is "SQLite only" or "PostgreSQL
only"; the rest name no database in their parameters (pure tests, or a test that sets up the
database it names itself). The storage contract's `sqlite-inline` runs count as SQLite only.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys

DIRS = ["tests/store/contract/", "tests/store/sqlite/", "tests/store/postgres/", "tests/core/",
        "tests/service/", "tests/tools/", "tests/faults/", "tests/crash/", "tests/phone_bot/",
        "tests/local_live/"]
PARAMS = re.compile(r"\[(.*)\]$")


def twin(test_id: str, db: str, other: str) -> str:
    found = PARAMS.search(test_id)
    parts = found.group(1).split("-")
    return test_id[:found.start()] + "[" + "-".join(other if p == db else p for p in parts) + "]"


def classify(ids: list[str]) -> dict[str, collections.Counter]:
    known = set(ids)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for test_id in ids:
        where = next((d for d in DIRS if test_id.startswith(d)), "elsewhere")
        found = PARAMS.search(test_id)
        parts = found.group(1).split("-") if found else []
        on_sqlite, on_pg = "sqlite" in parts, "postgres" in parts
        if on_sqlite and not on_pg:
            paired = twin(test_id, "sqlite", "postgres") in known
            counts[where]["both (pairs)" if paired else "SQLite only"] += 1
        elif on_pg and not on_sqlite:
            if twin(test_id, "postgres", "sqlite") not in known:
                counts[where]["PostgreSQL only"] += 1
        else:
            counts[where]["no database parameter"] += 1
    return counts


def main() -> None:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *sys.argv[1:]],
                         capture_output=True, text=True, check=True).stdout
    ids = [line.strip() for line in out.splitlines() if "::" in line]
    columns = ["both (pairs)", "SQLite only", "PostgreSQL only", "no database parameter"]
    print(f"{len(ids)} tests collected")
    print("| directory | " + " | ".join(columns) + " |")
    for where, counter in classify(ids).items():
        print(f"| `{where}` | " + " | ".join(str(counter[c]) for c in columns) + " |")


if __name__ == "__main__":
    main()
