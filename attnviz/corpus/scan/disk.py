"""What a scan's database file takes on disk: the estimate a page reserves before it starts, and the compact copy
that replaces the file when the scan finishes (:mod:`attnviz.corpus.scan.store` holds its tables)."""

from __future__ import annotations

from pathlib import Path

import duckdb

from attnviz.corpus.database import MEMORY_LIMIT

ROW_BYTES = 84  # per query and head: about 50 as the chunks write them, 34 in the compacted copy made beside them
HEAD_DOCUMENT_BYTES = 300  # per document and head: its statistics and label
FIXED_BYTES = 8 * 1024**2  # the aggregates, examples and token tables of a small scan


def estimated_scan_bytes(documents: int, max_tokens: int, n_layers: int, n_heads: int, characters: int,
                         qk_points: int = 0, head_dim: int = 64) -> int:
    """At most what a scan's files take on disk while it runs and as it is copied compactly at the end (every
    document read at ``max_tokens`` tokens; ``characters``: the documents' text), measured on the bundled BERT
    (1,015,416 query rows: 49.6 MB at the last chunk, 32.0 MB compacted). What the page reserves before it starts."""
    heads = n_layers * n_heads
    rows = documents * max_tokens * heads
    body = rows * ROW_BYTES + documents * heads * HEAD_DOCUMENT_BYTES + 2 * 4 * characters
    points = min(qk_points, documents * max_tokens)
    sample = 2 * (points * heads * (6 * head_dim + 64) + points * max_tokens * n_layers // 8)
    return int(body + sample + FIXED_BYTES)


# The parts the chunks wrote, grouped once as a finished scan is copied (the columns in the table's order).
COMPACTED = {
    "pair_parts": "SELECT layer, head, query_id, key_id, sum(weight) AS weight, sum(count) AS count FROM {source} "
                  "GROUP BY ALL ORDER BY layer, head, weight DESC",
    "key_parts": "SELECT layer, head, key_id, sum(weight) AS weight, sum(occurrences) AS occurrences FROM {source} "
                 "GROUP BY ALL ORDER BY layer, head, weight DESC",
}


def rewrite_compactly(path: str | Path) -> None:
    """A finished scan copied into a fresh file, which takes the old one's place: DuckDB reuses the blocks that the
    chunks' rewritten aggregate freed, but never gives them back to the disk. The parts are grouped on the way
    (:data:`COMPACTED`), so the copy is also the compaction: one pass over them, not two."""
    path = Path(path)
    fresh = path.with_name(f".{path.stem}.compact.duckdb")
    fresh.unlink(missing_ok=True)
    with duckdb.connect(str(path)) as connection:
        connection.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
        name = connection.execute("SELECT current_database()").fetchone()[0]  # the file's stem
        connection.execute(f"ATTACH '{_literal(fresh)}' AS fresh")
        connection.execute(f'COPY FROM DATABASE "{name}" TO fresh (SCHEMA)')  # tables and views, empty
        tables = [row[0] for row in connection.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'main' "
            "ORDER BY table_name", [name]).fetchall()]
        for table in tables:
            source = f'"{name}".main."{table}"'
            select = COMPACTED[table].format(source=source) if table in COMPACTED else f"SELECT * FROM {source}"
            connection.execute(f'INSERT INTO fresh.main."{table}" {select}')
        connection.execute("DETACH fresh")
    fresh.replace(path)


def _literal(path: Path) -> str:
    return str(path).replace("'", "''")
