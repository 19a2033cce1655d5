"""A DuckDB file of results (a scan's, a corpus importance run's): written by attnviz with its memory bounded, and
read as a file anyone may have written: read-only, with DuckDB's external access off and its configuration locked
(:func:`open_for_reading`), after its catalog was checked against the schema attnviz writes (:func:`check_catalog`:
a view could read the server's files, a generated column make gigabytes of text). Problems met reading are said in
words, without the server's paths (:func:`reading_problem`)."""

from __future__ import annotations

import functools
import json
import re
from contextlib import suppress
from pathlib import Path

import duckdb
import pandas as pd

MEMORY_LIMIT = "256MB"  # DuckDB's own buffer: what a scan's database may hold in memory (it spills to disk past
# it), so that a scan's memory does not grow with its database


def storable(text: str) -> str:
    """``text`` as DuckDB can keep it: a lone surrogate (which no UTF-8 holds) becomes U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


READ_CONFIG = {  # how a file anyone may have written is opened: it can read nothing but itself, and cannot undo it
    "enable_external_access": False, "autoload_known_extensions": False, "autoinstall_known_extensions": False,
    "memory_limit": MEMORY_LIMIT, "lock_configuration": True}


class NotAResultsFile(ValueError):
    """The file is not a scan's (or importance run's) database, or holds something its schema does not: a view,
    a macro, a table or a column of its own. ``missing``: it lacks the tables every such file has (a file cut short
    as it was created): the only case in which the page may delete its own copy."""

    def __init__(self, message: str, missing: bool = False):
        super().__init__(message)
        self.missing = missing


class DatabaseBusy(RuntimeError):
    """The file is being written by another connection (a scan still running, another process): try again."""

    in_words = True  # its message is for people (attnviz.ui.messages.problem_text)


def catalog(connection: duckdb.DuckDBPyConnection) -> dict:
    """What a database holds besides its rows: tables with their definitions (columns, types, defaults, generated
    columns and constraints), views with their SQL, and anything else (macros, sequences, types, indexes), as
    names. SQL is compared in lower case with its spaces folded."""
    tables = {f"{schema}.{table}": " ".join((sql or "").split()).lower() for schema, table, sql in
              connection.execute("SELECT schema_name, table_name, sql FROM duckdb_tables() "
                                 "WHERE database_name = current_database()").fetchall()}
    views = {f"{schema}.{view}": " ".join(sql.split()).lower() for schema, view, sql in connection.execute(
        "SELECT schema_name, view_name, sql FROM duckdb_views() WHERE database_name = current_database() "
        "AND NOT internal").fetchall()}
    other = [f"{kind} {name}" for kind, name in connection.execute(
        "SELECT function_type, function_name FROM duckdb_functions() WHERE database_name = current_database() "
        "AND NOT internal UNION ALL SELECT 'sequence', sequence_name FROM duckdb_sequences() "
        "WHERE database_name = current_database() UNION ALL SELECT 'type', type_name FROM duckdb_types() "
        "WHERE database_name = current_database() AND NOT internal UNION ALL SELECT 'index', index_name "
        "FROM duckdb_indexes() WHERE database_name = current_database()").fetchall()]
    return {"tables": tables, "views": views, "other": sorted(other)}


@functools.lru_cache(maxsize=4)
def expected_catalog(schema: str) -> dict:
    """The catalog a file made with ``schema`` has (built in memory, with this DuckDB)."""
    with duckdb.connect() as connection:
        connection.execute(schema)
        return catalog(connection)


def check_catalog(connection: duckdb.DuckDBPyConnection, schema: str, required: tuple[str, ...], what: str) -> None:
    """Refuse (:class:`NotAResultsFile`) a file that lacks a ``required`` table, or holds a table, column, view,
    macro or anything else that ``schema`` does not make (a view could read the server's files, a macro run
    anything): only what attnviz itself writes is read."""
    found, expected = catalog(connection), expected_catalog(schema)
    problems = [f"table {name}" for name in found["tables"] if name not in expected["tables"]]
    problems += [f"table {name}'s columns" for name, sql in found["tables"].items()
                 if name in expected["tables"] and sql != expected["tables"][name]]  # a column, default, constraint
    problems += [f"view {name}" for name, sql in found["views"].items() if expected["views"].get(name) != sql]
    problems += found["other"]
    if problems:
        columns_only = all(problem.endswith("'s columns") for problem in problems)
        raise NotAResultsFile(f"it holds what {what} does not ({', '.join(sorted(problems)[:4])}"
                              f"{', …' if len(problems) > 4 else ''}): it is not read"
                              f"{' (if an earlier attnviz wrote it, scan again)' if columns_only else ''}")
    missing = [name for name in required if f"main.{name}" not in found["tables"]]
    if missing:  # nothing foreign, and not even its first tables: a file cut short as it was created
        raise NotAResultsFile(f"it is not {what}: it has no {', '.join(missing)} table", missing=True)


def open_for_reading(path: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to a DuckDB file that anyone may have written, with external access off and the
    configuration locked. A lock held by a writer is :class:`DatabaseBusy`; a file that is not a DuckDB database
    at all is :class:`NotAResultsFile` (``missing``)."""
    try:
        return duckdb.connect(str(path), read_only=True, config=READ_CONFIG)
    except duckdb.Error as problem:
        raise reading_problem(problem) from None


DAMAGED = ("not a valid duckdb", "could not read enough bytes", "corrupt", "checksum", "invalid database",
           "unsupported file", "serialization")  # what DuckDB says of a file cut short or scrambled


def reading_problem(problem: Exception) -> Exception:
    """A DuckDB error met reading a file, in words and without the server's paths: :class:`DatabaseBusy` for a
    lock (a writer) or memory (a passing failure), :class:`NotAResultsFile` (``missing``: damaged beyond reading,
    never a scan again) for a file cut short or corrupt, else a plain error in words."""
    text = str(problem).lower()
    if isinstance(problem, duckdb.ConnectionException) or "lock" in text or "conflicting" in text:
        return DatabaseBusy("it is being written now")
    if isinstance(problem, (duckdb.OutOfMemoryException, MemoryError)) or "out of memory" in text:
        return DatabaseBusy("the server is short of memory for it now")
    if any(sign in text for sign in DAMAGED):
        return NotAResultsFile("it is not a DuckDB database, or it is damaged (cut short or corrupt)", missing=True)
    return RuntimeError(f"DuckDB cannot read it ({without_paths(str(problem).splitlines()[0])})")


def without_paths(text: str) -> str:
    """``text`` with every absolute path in it replaced by "the file": a message never shows the server's paths."""
    return re.sub(r"""(?<![\w.])/[^\s"':]+""", "the file", text)


class DatabaseFile:
    """One DuckDB file of results (a scan's, a corpus importance run's): its connection, its ``settings`` table
    (key -> JSON) and a context manager. Written (``schema`` created if missing, memory bounded) or, with
    ``read_only``, read as a file anyone may have written (:func:`open_for_reading`), after its catalog was checked
    against ``schema`` (:func:`check_catalog`)."""

    REQUIRED = ("settings", "documents")
    WHAT = "a results file"

    def __init__(self, path: str | Path, schema: str | None = None, *, read_only: bool = False):
        self.path = Path(path)
        if read_only:
            self.connection = open_for_reading(self.path)
            try:
                check_catalog(self.connection, schema or "", self.REQUIRED, self.WHAT)
                self.settings = self.read_settings()
            except duckdb.Error as problem:
                self.close()
                raise reading_problem(problem) from None
            except BaseException:
                self.close()
                raise
        else:
            self.connection = duckdb.connect(str(self.path))
            self.connection.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
            self.connection.execute(schema or "")

    def close(self) -> None:
        with suppress(duckdb.Error):
            self.connection.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def read_settings(self) -> dict:
        try:
            return {str(key): json.loads(value) for key, value in self.connection.execute(
                "SELECT key, value FROM settings").fetchall()}
        except (ValueError, TypeError):  # not JSON: not a file attnviz wrote
            raise NotAResultsFile("its settings are not JSON: it is not read") from None

    def set(self, **values) -> None:
        for key, value in values.items():
            self.connection.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", [key, json.dumps(value)])

    def done_documents(self) -> set[int]:
        return {row[0] for row in self.connection.execute("SELECT doc FROM documents").fetchall()}

    def _insert(self, table: str, frame: pd.DataFrame) -> None:
        insert_frame(self.connection, table, frame)


def insert_frame(connection: duckdb.DuckDBPyConnection, table: str, frame: pd.DataFrame,
                 verb: str = "INSERT") -> None:
    """Every row of ``frame`` inserted into ``table`` (its columns by name) in one statement: DuckDB's
    ``executemany`` runs one statement per row."""
    connection.register("frame", frame)
    try:
        columns = ", ".join(f'"{c}"' for c in frame.columns)
        connection.execute(f"{verb} INTO {table} ({columns}) SELECT {columns} FROM frame")
    finally:
        connection.unregister("frame")


def sql_as_run(sql: str, parameters: list) -> str:
    """``sql`` with each ``?`` replaced by its parameter written as a SQL literal: what a reader can paste into
    DuckDB to run the same search (for showing only; the search itself binds its parameters)."""
    pieces = sql.split("?")
    if len(pieces) != len(parameters) + 1:
        return sql
    literals = [str(value) if isinstance(value, (int, float)) and not isinstance(value, bool)
                else "'" + str(value).replace("'", "''") + "'" for value in parameters]
    return "".join(piece + literal for piece, literal in zip(pieces, [*literals, ""], strict=True))
