"""runlane's schema with the columns of ``runs`` in another order, as SQL.

An experiment for ``bench.backend_instructions --runs-columns``: how much of
a run's PostgreSQL work is the position of the columns its updates compare.
An UPDATE checks every indexed column of the old row against the new one
(to decide whether it may be a HOT update), and a column is found at a
fixed offset only when no variable-width or null column comes before it;
otherwise PostgreSQL walks the row from its start (``nocachegetattr``).
PostgreSQL cannot reorder a table's columns in place, so the schema is
dumped (``pg_dump --schema-only``), the ``CREATE TABLE runlane.runs``
statement's column lines reordered, and the dump replayed over a dropped
``runlane`` schema:

- ``indexed-first``: the indexed fixed-width NOT NULL columns (widest
  alignment first), the other fixed-width NOT NULL columns, ``status``, the
  other indexed columns (NOT NULL first), then the rest in their order;
- ``same``: the order as migrated, a control that shows the dump and the
  replay alone change nothing.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import psycopg

ORDERS = ("indexed-first", "same")

COLUMNS = """
SELECT attname, attlen, attalign, attnotnull FROM pg_attribute
WHERE attrelid = 'runlane.runs'::regclass AND attnum > 0 AND NOT attisdropped
ORDER BY attnum
"""

INDEX_DEFINITIONS = """
SELECT pg_get_indexdef(indexrelid) FROM pg_index
WHERE indrelid = 'runlane.runs'::regclass
"""

# Fixed-width columns with the strictest alignment first leave no padding.
_ALIGNMENT_RANK = {"d": 0, "i": 1, "s": 2, "c": 3}


def indexed_first(columns: list[tuple[str, int, str, bool]], indexed: set[str]) -> list[str]:
    """The column names in the ``indexed-first`` order."""

    def place(position: int) -> tuple[int, int, int, int]:
        name, width, alignment, not_null = columns[position]
        fixed = width > 0
        if name in indexed and fixed and not_null:
            return (0, _ALIGNMENT_RANK[alignment], 0, position)
        if fixed and not_null:
            return (1, _ALIGNMENT_RANK[alignment], 0, position)
        if name in indexed:
            # status first: the first variable-width column still has a
            # fixed offset, and every claim and outcome changes it.
            return (2, 0 if not_null else 1, 0 if name == "status" else 1, position)
        return (3, 0, 0, position)

    return [columns[p][0] for p in sorted(range(len(columns)), key=place)]


def reorder_table(dump: str, order: list[str]) -> str:
    """The dump with ``CREATE TABLE runlane.runs``'s columns in ``order``
    (its constraints after them, as pg_dump writes them)."""
    lines = dump.splitlines()
    start = lines.index("CREATE TABLE runlane.runs (")
    end = start + lines[start:].index(")")
    entries: list[list[str]] = []
    for line in lines[start + 1 : end]:
        # A column or constraint starts at four spaces; deeper lines continue it.
        if line.startswith("    ") and not line.startswith("     "):
            entries.append([line])
        else:
            entries[-1].append(line)
    columns: dict[str, str] = {}
    constraints: list[str] = []
    for entry in entries:
        text = "\n".join(entry).rstrip(",")
        first = text.split(None, 1)[0]
        if first == "CONSTRAINT":
            constraints.append(text)
        else:
            columns[first.strip('"')] = text
    if set(columns) != set(order):
        raise ValueError(f"the dump's columns of runs differ: {sorted(set(columns) ^ set(order))}")
    body = ",\n".join([columns[name] for name in order] + constraints)
    return "\n".join(lines[: start + 1] + body.splitlines() + lines[end:])


def rewritten_schema(url: str, pg_bin: Path, order: str) -> str:
    """SQL that replaces the ``runlane`` schema of the database at ``url``
    (migrated, with no runs yet) by the same with ``runs`` in ``order``."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, not {order!r}")
    with psycopg.connect(url) as conn:
        columns = [
            (str(name), int(width), str(alignment), bool(not_null))
            for name, width, alignment, not_null in conn.execute(COLUMNS)
        ]
        definitions = [str(row[0]) for row in conn.execute(INDEX_DEFINITIONS)]
    indexed: set[str] = set()
    for definition in definitions:
        # Every identifier after USING: key columns, expressions and predicate.
        indexed |= set(re.findall(r"[a-z_]+", definition.split(" USING ", 1)[1]))
    names = [column[0] for column in columns]
    wanted = indexed_first(columns, indexed) if order == "indexed-first" else names
    dump = subprocess.run(
        [str(pg_bin / "pg_dump"), "--schema-only", "--schema=runlane", url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    replay = "\n".join(
        line
        for line in reorder_table(dump, wanted).splitlines()
        # psql's meta-commands (\restrict) and the dump's empty search_path,
        # which would outlive the replay on this connection.
        if not line.startswith("\\") and "set_config('search_path'" not in line
    )
    return f"DROP SCHEMA runlane CASCADE;\n{replay}\n"
