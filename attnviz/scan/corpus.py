"""Corpora for a scan: the bundled one (English that ships with Python), or a file a user brings.

A file is read by a real reader for its format (never executed): ``.txt`` (one document per line, or per
blank-line-separated paragraph), ``.jsonl`` (a string field, ``text`` by default), ``.csv`` (a chosen column) and
``.parquet`` (a chosen column, read by DuckDB). A file over :func:`max_corpus_bytes` is refused as a whole; a
document that is empty, cannot be decoded as UTF-8, is not text or is longer than :data:`MAX_DOCUMENT_CHARS` is
counted in the :class:`CorpusReport` and left out, never fatal.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import os
import random
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

FORMATS = (".txt", ".jsonl", ".csv", ".parquet")
TXT_SPLITS = ("line", "paragraph")  # one document per line, or per blank-line-separated paragraph
MAX_DOCUMENT_CHARS = 100_000  # longer documents are counted and left out (a scan reads a few hundred tokens each)
MAX_DOCUMENTS = 1_000_000  # a file may hold at most this many documents; the rest are counted, not read
DEFAULT_FIELD = "text"
BUNDLED = "bundled"  # the command line's and the page's name for the bundled corpus
TOPIC_DOCUMENT_CHARS = 1_500  # the documentation topics are cut into documents of about this many characters


class CorpusRefused(ValueError):
    """The file cannot be read as a corpus at all (wrong format, too large, broken); the message says why."""


def max_corpus_bytes() -> int:
    """The largest corpus file a server accepts (``ATTNVIZ_CORPUS_MB``, 200 by default)."""
    try:
        return int(max(0.0, float(os.environ.get("ATTNVIZ_CORPUS_MB", "200"))) * 1024**2)
    except ValueError:
        return 200 * 1024**2


@dataclass(frozen=True)
class Document:
    text: str
    source: str  # where it came from: "line 12", "row 3", "topics: assert", "docstring: json.dumps"


@dataclass
class CorpusReport:
    """What reading a corpus met, besides the documents it kept."""

    kept: int = 0
    empty: int = 0
    undecodable: int = 0  # not UTF-8 (a .txt or .jsonl line, a CSV row)
    not_text: int = 0  # a JSON line that is not an object with a string field; a non-string cell
    too_long: int = 0  # longer than MAX_DOCUMENT_CHARS
    beyond_limit: int = 0  # past MAX_DOCUMENTS

    def lines(self) -> list[str]:
        """The report in words, one line per kind of problem met (nothing when every document was kept)."""
        said = []
        for count, words in ((self.empty, "empty"), (self.undecodable, "not valid UTF-8"),
                             (self.not_text, "not text (a missing field, a number, a list…)"),
                             (self.too_long, f"longer than {MAX_DOCUMENT_CHARS:,} characters"),
                             (self.beyond_limit, f"past the first {MAX_DOCUMENTS:,} documents")):
            if count:
                said.append(f"{count:,} document{'s' if count != 1 else ''} {words}: left out")
        return said


@dataclass
class Corpus:
    name: str
    documents: list[Document]
    report: CorpusReport = field(default_factory=CorpusReport)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the documents' texts in order: the same documents give the same scan file."""
        digest = hashlib.sha256()
        for document in self.documents:
            digest.update(hashlib.sha256(document.text.encode("utf-8", "surrogatepass")).digest())
        return digest.hexdigest()


class _Collector:
    """Counts what it is given and keeps what is a document."""

    def __init__(self):
        self.report = CorpusReport()
        self.documents: list[Document] = []

    def offer(self, text: object, source: str) -> None:
        if len(self.documents) >= MAX_DOCUMENTS:
            self.report.beyond_limit += 1
            return
        if not isinstance(text, str):
            self.report.not_text += 1
            return
        text = text.replace("\x00", "").strip()
        if not text:
            self.report.empty += 1
        elif len(text) > MAX_DOCUMENT_CHARS:
            self.report.too_long += 1
        else:
            self.documents.append(Document(text, source))

    def corpus(self, name: str) -> Corpus:
        self.report.kept = len(self.documents)
        return Corpus(name, self.documents, self.report)


def _decoded(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _read_bytes(source, limit: int) -> bytes:
    """The file's bytes (a path, or an uploaded file-like object), refused past ``limit``."""
    if isinstance(source, (str, Path)):
        size = Path(source).stat().st_size
        if size > limit:
            raise CorpusRefused(f"the file is {size / 1024**2:,.1f} MB; a corpus may be at most "
                                f"{limit / 1024**2:,.0f} MB here")
        return Path(source).read_bytes()
    data = source.read(limit + 1)
    if len(data) > limit:
        raise CorpusRefused(f"the file is over {limit / 1024**2:,.0f} MB, the most a corpus may be here")
    return data


def format_of(name: str) -> str:
    suffix = Path(name).suffix.lower()
    if suffix not in FORMATS:
        raise CorpusRefused(f"{Path(name).name!r} is not a corpus file attnviz reads: use "
                            f"{', '.join(FORMATS)}")
    return suffix


def read_corpus(source, name: str | None = None, *, split: str = "line", field_name: str | None = None,
                max_bytes: int | None = None) -> Corpus:
    """Read a corpus file: ``source`` is a path or a file-like object (then ``name`` gives its format).

    ``split`` ("line" or "paragraph") applies to ``.txt``; ``field_name`` is the JSON field (default ``text``) or
    the CSV / Parquet column (default ``text``, else the only column)."""
    name = name or str(source)
    suffix = format_of(name)
    limit = max_corpus_bytes() if max_bytes is None else max_bytes
    if suffix == ".parquet":
        return _read_parquet(source, name, field_name, limit)
    raw = _read_bytes(source, limit)
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # the UTF-8 byte order mark some editors write
    collector = _Collector()
    if suffix == ".txt":
        if split not in TXT_SPLITS:
            raise CorpusRefused(f"a .txt corpus is split by {' or '.join(TXT_SPLITS)}, not {split!r}")
        _read_txt(raw, split, collector)
    elif suffix == ".jsonl":
        _read_jsonl(raw, field_name or DEFAULT_FIELD, collector)
    else:
        _read_csv(raw, field_name, collector)
    return collector.corpus(Path(name).name)


def _read_txt(raw: bytes, split: str, collector: _Collector) -> None:
    lines = raw.replace(b"\r\n", b"\n").split(b"\n")
    if split == "line":
        for number, line in enumerate(lines, 1):
            text = _decoded(line)
            if text is None:
                collector.report.undecodable += 1
            elif text.strip():  # blank lines separate nothing here: they are not documents
                collector.offer(text, f"line {number}")
        return
    paragraph: list[bytes] = []
    first = 1
    for number, line in enumerate([*lines, b""], 1):
        if line.strip():
            if not paragraph:
                first = number
            paragraph.append(line)
            continue
        if paragraph:
            text = _decoded(b"\n".join(paragraph))
            if text is None:
                collector.report.undecodable += 1
            else:
                collector.offer(text, f"paragraph at line {first}")
            paragraph = []


def _read_jsonl(raw: bytes, field_name: str, collector: _Collector) -> None:
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        text = _decoded(line)
        if text is None:
            collector.report.undecodable += 1
            continue
        try:
            record = json.loads(text)
        except (ValueError, RecursionError):
            collector.report.not_text += 1
            continue
        collector.offer(record.get(field_name) if isinstance(record, dict) else None, f"line {number}")


def _read_csv(raw: bytes, column: str | None, collector: _Collector) -> None:
    text = _decoded(raw)
    broken = text is None
    if broken:  # rows that decode are kept; the others (a replacement character where bytes were bad) counted
        text = raw.decode("utf-8", errors="replace")
    csv.field_size_limit(MAX_DOCUMENT_CHARS * 4 + 1)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except (StopIteration, csv.Error) as problem:
        raise CorpusRefused("the CSV file has no header row") from problem
    index = _column_index(header, column)
    try:
        for number, row in enumerate(reader, 2):
            cell = row[index] if index < len(row) else None
            if broken and isinstance(cell, str) and "\ufffd" in cell:
                collector.report.undecodable += 1
                continue
            collector.offer(cell, f"row {number}")
    except csv.Error as problem:
        collector.report.not_text += 1  # a field past the size limit, a NUL: the rest of the file is unreadable
        raise CorpusRefused(f"the CSV file breaks at row {reader.line_num:,}: {problem}") from problem


def _column_index(header: list[str], column: str | None) -> int:
    wanted = column or (DEFAULT_FIELD if DEFAULT_FIELD in header else (header[0] if len(header) == 1 else None))
    if wanted is None or wanted not in header:
        raise CorpusRefused(f"choose the column that holds the text: this file has {', '.join(map(repr, header))}")
    return header.index(wanted)


def _read_parquet(source, name: str, column: str | None, limit: int) -> Corpus:
    import duckdb

    if not isinstance(source, (str, Path)):
        raise CorpusRefused("a Parquet corpus is read from a saved file")
    _read_bytes_size_only(Path(source), limit)
    try:
        connection = duckdb.connect()  # in memory; the reader only reads the one file it is given
        columns = _parquet_text_columns(connection, source)
        wanted = column or (DEFAULT_FIELD if DEFAULT_FIELD in columns else (columns[0] if len(columns) == 1 else None))
        if wanted is None or wanted not in columns:
            raise CorpusRefused(f"choose the column that holds the text: this file has {', '.join(map(repr, columns))}")
        relation = connection.execute(
            f"SELECT {_quoted(wanted)} FROM read_parquet(?) LIMIT {MAX_DOCUMENTS + 1}", [str(source)])
        collector = _Collector()
        number = 0
        while rows := relation.fetchmany(10_000):
            for (value,) in rows:
                number += 1
                collector.offer(value, f"row {number}")
        connection.close()
    except duckdb.Error as problem:
        raise CorpusRefused(f"the Parquet file cannot be read: {_without_path(problem, source)}") from problem
    return collector.corpus(Path(name).name)


def _parquet_text_columns(connection, source: str | Path) -> list[str]:
    """The top-level text (VARCHAR) columns of a Parquet file: what can hold a corpus's documents (not numbers,
    nor the parts of a nested column)."""
    return [row[0] for row in connection.execute("DESCRIBE SELECT * FROM read_parquet(?)", [str(source)]).fetchall()
            if row[1] == "VARCHAR"]


def _without_path(problem: Exception, source: str | Path) -> str:
    """A reader's message without the server's path of the file (the user knows the file by its name)."""
    return str(problem).splitlines()[0].replace(str(source), "the file")


def _read_bytes_size_only(path: Path, limit: int) -> None:
    size = path.stat().st_size
    if size > limit:
        raise CorpusRefused(f"the file is {size / 1024**2:,.1f} MB; a corpus may be at most "
                            f"{limit / 1024**2:,.0f} MB here")


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def columns_of(path: str | Path) -> list[str]:
    """The fields or columns a corpus file offers for its text (none for ``.txt``): what the page lets one choose."""
    suffix = format_of(str(path))
    if suffix == ".txt":
        return []
    if suffix == ".parquet":
        import duckdb

        try:
            with duckdb.connect() as connection:
                return _parquet_text_columns(connection, path)
        except duckdb.Error as problem:
            raise CorpusRefused(f"the Parquet file cannot be read: {_without_path(problem, path)}") from problem
    with open(path, "rb") as handle:
        head = handle.read(1_000_000)
    if suffix == ".csv":
        text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
        try:
            return next(csv.reader(io.StringIO(text, newline="")))
        except (StopIteration, csv.Error):
            return []
    names: list[str] = []
    for line in head.split(b"\n")[:200]:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            names += [key for key, value in record.items() if isinstance(value, str) and key not in names]
    return names


# ---------------------------------------------------------------------------------------------------------------
# The bundled corpus


def bundled_corpus() -> Corpus:
    """English that ships with Python: its documentation topics (cut into documents of about
    TOPIC_DOCUMENT_CHARS) and the standard library's docstrings (one document each), shuffled with a fixed seed
    so that the first N documents mix both."""
    from attnviz.tiny_gpt_text import documentation_topics

    documents = []
    for topic, text in documentation_topics():
        piece: list[str] = []
        for paragraph in text.split("\n\n"):
            piece.append(paragraph)
            if sum(len(p) for p in piece) >= TOPIC_DOCUMENT_CHARS:
                documents.append(Document("\n\n".join(piece), f"topics: {topic}"))
                piece = []
        if piece:
            documents.append(Document("\n\n".join(piece), f"topics: {topic}"))
    documents += [Document(text, f"docstring: {where}") for where, text in kept_docstrings()]
    random.Random(0).shuffle(documents)
    collector = _Collector()
    for document in documents:
        collector.offer(document.text, document.source)
    return collector.corpus(BUNDLED)


@functools.lru_cache(maxsize=1)
def kept_docstrings() -> list[tuple[str, str]]:
    """The standard library's docstrings (:func:`attnviz.tiny_gpt_text.parse_docstrings`, 10-20 s to parse), kept in
    a private file of this account's in the temporary folder per Python version, and read from there next time
    (not kept where that folder is not safe: a link, another account's, writable by others)."""
    from attnviz.models.disk import private_folder
    from attnviz.tiny_gpt_text import parse_docstrings

    folder = private_folder(Path(tempfile.gettempdir()) / f"attnviz-text-{os.getuid()}")
    cache = None if folder is None else folder / f"docstrings-{'-'.join(map(str, sys.version_info[:3]))}.json"
    if cache is not None and cache.is_file():
        try:
            return [(str(name), str(text)) for name, text in json.loads(cache.read_text(encoding="utf-8"))]
        except (OSError, ValueError, TypeError):
            pass
    found = parse_docstrings()
    if cache is not None:
        scratch = cache.with_name(f".{cache.name}.{os.getpid()}")
        try:
            scratch.write_text(json.dumps(found), encoding="utf-8")
            scratch.replace(cache)  # atomic: a reader never sees half a file
        except OSError:
            pass
    return found


def open_corpus(spec: str, *, split: str = "line", field_name: str | None = None) -> Corpus:
    """The command line's corpus: :data:`BUNDLED`, or a file's path."""
    if spec == BUNDLED:
        return bundled_corpus()
    if not Path(spec).is_file():
        raise CorpusRefused(f"no corpus file at {spec!r}")
    return read_corpus(spec, split=split, field_name=field_name)
