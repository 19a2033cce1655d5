"""Corpora for a scan: the bundled one (English that ships with Python), or a file a user brings.

A file is read by a real reader for its format (never executed): ``.txt`` (one document per line, or per
blank-line-separated paragraph), ``.jsonl`` (a string field, ``text`` by default), ``.csv`` (a chosen column) and
``.parquet`` (a chosen top-level text column, read by pyarrow). A file over :func:`max_corpus_bytes` is refused as
a whole; a document that is empty, cannot be decoded as UTF-8 (bad bytes, or a JSON string with a lone
surrogate), is not text or is longer than :data:`MAX_DOCUMENT_CHARS` is counted in the :class:`CorpusReport` and
left out, never fatal.

Reading is bounded by what a file decodes to, not by its size in bytes (a few hundred bytes of Parquet can decode
to gigabytes, a few megabytes of short lines to millions of objects):

* files are streamed, a line (at most :data:`MAX_LINE_BYTES`) or a few Parquet rows at a time: nothing holds the
  whole file;
* at most :data:`MAX_RECORDS` lines (rows, for CSV and Parquet) are read; the rest are counted, not parsed;
* the documents together hold at most :func:`max_corpus_characters` characters (and the texts looked at, blank
  ones included, twice that): from the first document that would pass it, every later one is counted and left out;
* a Parquet column chunk may decompress to at most :func:`max_parquet_chunk_bytes`, checked in the file's footer
  before a page is read, and a value longer than a document may be is counted without being made a string;
* whoever reads a corpus may keep only its first documents (``keep``): the rest are counted and fingerprinted.

The page reads a file's facts (:func:`probe`) in a child process with a memory and CPU cap
(:mod:`attnviz.scan.corpus_probe`), once per file.
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

FORMATS = (".txt", ".jsonl", ".csv", ".parquet")
TXT_SPLITS = ("line", "paragraph")  # one document per line, or per blank-line-separated paragraph
MAX_DOCUMENT_CHARS = 100_000  # longer documents are counted and left out (a scan reads a few hundred tokens each)
MAX_RECORDS = 1_000_000  # lines (rows) read from a file; the rest are counted, not read
MAX_LINE_BYTES = 4 * 1024**2  # a longer line (or paragraph, or CSV row) is counted as too long, never held whole
DEFAULT_PARQUET_CHUNK_MB = 256  # what one column chunk of a Parquet file may decompress to
PARQUET_BATCH_ROWS = 64  # rows decoded at once (a few MB; each value's length is checked before it is a string)
DEFAULT_CORPUS_CHARS = 100_000_000
CHARS_EVERY = 256  # the running character count is noted every this many documents (for disk estimates)
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


def max_corpus_characters() -> int:
    """The most characters a corpus's documents hold together (``ATTNVIZ_CORPUS_CHARS``, 100 million): what a
    reader may keep in memory, at most four bytes a character."""
    try:
        return max(1, int(float(os.environ.get("ATTNVIZ_CORPUS_CHARS", DEFAULT_CORPUS_CHARS))))
    except ValueError:
        return DEFAULT_CORPUS_CHARS


def max_parquet_chunk_bytes() -> int:
    """What one column chunk of a Parquet corpus may decompress to (``ATTNVIZ_PARQUET_CHUNK_MB``, 256)."""
    try:
        return int(max(1.0, float(os.environ.get("ATTNVIZ_PARQUET_CHUNK_MB", DEFAULT_PARQUET_CHUNK_MB))) * 1024**2)
    except ValueError:
        return DEFAULT_PARQUET_CHUNK_MB * 1024**2


@dataclass(frozen=True)
class Document:
    text: str
    source: str  # where it came from: "line 12", "row 3", "topics: assert", "docstring: json.dumps"


@dataclass
class CorpusReport:
    """What reading a corpus met, besides the documents it kept."""

    kept: int = 0  # documents in the corpus (kept in memory or not)
    empty: int = 0
    undecodable: int = 0  # not UTF-8 (a .txt or .jsonl line, a CSV row), or a string with a lone surrogate
    not_text: int = 0  # a JSON line that is not an object with a string field; a non-string cell
    too_long: int = 0  # longer than MAX_DOCUMENT_CHARS (or a line, paragraph or row of over MAX_LINE_BYTES)
    past_characters: int = 0  # after the documents reached max_corpus_characters()
    beyond_limit: int = 0  # lines (rows) past the first MAX_RECORDS: counted, not read

    def lines(self) -> list[str]:
        """The report in words, one line per kind of problem met (nothing when every document was kept)."""
        said = []
        for count, words in ((self.empty, "empty"), (self.undecodable, "not valid UTF-8"),
                             (self.not_text, "not text (a missing field, a number, a list…)"),
                             (self.too_long, f"longer than {MAX_DOCUMENT_CHARS:,} characters"),
                             (self.past_characters, f"after the first {max_corpus_characters():,} characters of "
                                                    "documents")):
            if count:
                said.append(f"{count:,} document{'s' if count != 1 else ''} {words}: left out")
        if self.beyond_limit:
            said.append(f"{self.beyond_limit:,} more line{'s' if self.beyond_limit != 1 else ''} past the first "
                        f"{MAX_RECORDS:,} of the file: not read")
        return said


@dataclass
class Corpus:
    name: str
    documents: list[Document]  # the first documents (all of them unless the reader was asked to keep fewer)
    report: CorpusReport = field(default_factory=CorpusReport)
    size: int | None = None  # how many documents the corpus holds (None: exactly ``documents``)
    digest: str | None = None  # the fingerprint, when the reader computed it over every document
    chars_every: list[int] = field(default_factory=list)  # characters of the first CHARS_EVERY * (i + 1) documents
    characters: int | None = None  # characters of every document together

    @property
    def count(self) -> int:
        """How many documents the corpus holds, kept in memory or not."""
        return len(self.documents) if self.size is None else self.size

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the documents' texts in order: the same documents give the same scan file."""
        if self.digest is not None:
            return self.digest
        digest = hashlib.sha256()
        for document in self.documents:
            digest.update(hashlib.sha256(document.text.encode("utf-8", "surrogatepass")).digest())
        return digest.hexdigest()

    def characters_of_first(self, count: int) -> int:
        """At least the characters of the first ``count`` documents (an upper bound where the reader noted
        them only every :data:`CHARS_EVERY` documents)."""
        if self.size is None or count <= len(self.documents):
            return sum(len(document.text) for document in self.documents[:count])
        note = -(-count // CHARS_EVERY) - 1  # the first note at or after ``count`` documents
        if note < len(self.chars_every):
            return self.chars_every[note]
        return self.characters if self.characters is not None else count * MAX_DOCUMENT_CHARS


class _Collector:
    """Counts what it is given, fingerprints every document, and keeps the first ``keep`` (all: None)."""

    def __init__(self, keep: int | None = None):
        self.report = CorpusReport()
        self.documents: list[Document] = []
        self.keep = keep
        self.count = 0
        self.characters = 0
        self.budget = max_corpus_characters()
        self.full = False  # the character budget is spent: every later document is counted, not kept
        self.looked_at = 0  # characters of every text offered (kept or not): at most twice the budget
        self.digest = hashlib.sha256()
        self.chars_every: list[int] = []

    def offer(self, text: object, source: str) -> None:
        if not isinstance(text, str):
            self.report.not_text += 1
            return
        if self.full:  # past the character budget: counted, not looked at
            self.report.past_characters += 1
            return
        if len(text) > MAX_DOCUMENT_CHARS + 1024:  # far too long: not even copied (its spaces may be stripped)
            self.report.too_long += 1
            return
        self.looked_at += len(text)
        if self.looked_at > 2 * self.budget:  # what is read and left out (blanks) costs time too: bounded as well
            self.full = True
            self.report.past_characters += 1
            return
        text = text.replace("\x00", "").strip()
        if not text:
            self.report.empty += 1
            return
        if len(text) > MAX_DOCUMENT_CHARS:
            self.report.too_long += 1
            return
        try:
            encoded = text.encode("utf-8")  # a lone surrogate (JSON's "\ud800") is not text a tokenizer takes
        except UnicodeEncodeError:
            self.report.undecodable += 1
            return
        if self.full or self.characters + len(text) > self.budget:
            self.full = True
            self.report.past_characters += 1
            return
        self.characters += len(text)
        self.count += 1
        self.digest.update(hashlib.sha256(encoded).digest())
        if self.count % CHARS_EVERY == 0:
            self.chars_every.append(self.characters)
        if self.keep is None or len(self.documents) < self.keep:
            self.documents.append(Document(text, source))

    def corpus(self, name: str) -> Corpus:
        self.report.kept = self.count
        return Corpus(name, self.documents, self.report, size=self.count, digest=self.digest.hexdigest(),
                      chars_every=self.chars_every, characters=self.characters)


def format_of(name: str) -> str:
    suffix = Path(name).suffix.lower()
    if suffix not in FORMATS:
        raise CorpusRefused(f"{Path(name).name!r} is not a corpus file attnviz reads: use "
                            f"{', '.join(FORMATS)}")
    return suffix


class _Bounded(io.RawIOBase):
    """A file-like source read through, refused in words once it has given more than ``limit`` bytes."""

    def __init__(self, source, limit: int, owned: bool):
        self.source, self.limit, self.given, self.owned = source, limit, 0, owned

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.source.read(len(buffer))
        self.given += len(data)
        if self.given > self.limit:
            raise CorpusRefused(f"the file is over {self.limit / 1024**2:,.0f} MB, the most a corpus may be here")
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if self.owned and not self.closed:
            self.source.close()
        super().close()


def _open(source, limit: int):
    """A buffered binary reader over ``source`` (a path, or a binary file-like object), refused past ``limit``."""
    if isinstance(source, (str, Path)):
        size = Path(source).stat().st_size
        if size > limit:
            raise CorpusRefused(f"the file is {size / 1024**2:,.1f} MB; a corpus may be at most "
                                f"{limit / 1024**2:,.0f} MB here")
        return io.BufferedReader(_Bounded(open(source, "rb"), limit, owned=True), 1 << 20)
    return io.BufferedReader(_Bounded(source, limit, owned=False), 1 << 20)


def read_corpus(source, name: str | None = None, *, split: str = "line", field_name: str | None = None,
                max_bytes: int | None = None, keep: int | None = None) -> Corpus:
    """Read a corpus file: ``source`` is a path or a binary file-like object (then ``name`` gives its format).

    ``split`` ("line" or "paragraph") applies to ``.txt``; ``field_name`` is the JSON field (default ``text``) or
    the CSV / Parquet column (default ``text``, else the only column). ``keep``: how many of the first documents
    to keep in memory (all: None); every document is counted and fingerprinted either way."""
    name = name or str(source)
    suffix = format_of(name)
    limit = max_corpus_bytes() if max_bytes is None else max_bytes
    collector = _Collector(keep)
    if suffix == ".txt" and split not in TXT_SPLITS:
        raise CorpusRefused(f"a .txt corpus is split by {' or '.join(TXT_SPLITS)}, not {split!r}")
    if suffix == ".parquet":
        _read_parquet(source, field_name, collector, limit)
        return collector.corpus(Path(name).name)
    handle = _open(source, limit)
    try:
        if suffix == ".txt":
            _read_txt(handle, split, collector)
        elif suffix == ".jsonl":
            _read_jsonl(handle, field_name or DEFAULT_FIELD, collector)
        else:
            _read_csv(handle, field_name, collector)
    finally:
        handle.close()  # closes the file it opened, never a caller's
    return collector.corpus(Path(name).name)


def _lines(handle) -> Iterator[tuple[int, bytes | None]]:
    """(line number, the line with its end) for every line of ``handle``, after a UTF-8 byte order mark; a line
    of more than MAX_LINE_BYTES gives None, and is skipped without being held. Stops after MAX_RECORDS lines,
    leaving the rest of the file to :func:`_rest`."""
    number = 0
    while number < MAX_RECORDS:
        line = handle.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if number == 0 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]  # the UTF-8 byte order mark some editors write
        number += 1
        if len(line) > MAX_LINE_BYTES:
            while not line.endswith(b"\n"):
                line = handle.readline(1 << 20)
                if not line:
                    break
            yield number, None
            continue
        yield number, line


def _rest(handle) -> int:
    """How many lines are left in ``handle``, counted (not read as lines)."""
    lines, last = 0, b"\n"
    while block := handle.read(1 << 20):
        lines += block.count(b"\n")
        last = block[-1:]
    return lines + (last != b"\n")


def _decoded(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _ending_stripped(line: bytes) -> bytes:
    return line[:-2] if line.endswith(b"\r\n") else line[:-1] if line.endswith(b"\n") else line


def _read_txt(handle, split: str, collector: _Collector) -> None:
    if split == "line":
        for number, line in _lines(handle):
            if line is None:
                collector.report.too_long += 1
                continue
            text = _decoded(_ending_stripped(line))
            if text is None:
                collector.report.undecodable += 1
            elif text.strip():  # blank lines separate nothing here: they are not documents
                collector.offer(text, f"line {number}")
        collector.report.beyond_limit += _rest(handle)
        return
    paragraph: list[bytes] = []
    held, too_long, first = 0, False, 1

    def close() -> None:
        if too_long:
            collector.report.too_long += 1
        elif paragraph:
            text = _decoded(b"\n".join(paragraph))
            if text is None:
                collector.report.undecodable += 1
            else:
                collector.offer(text, f"paragraph at line {first}")

    for number, line in _lines(handle):
        if line is not None and not line.strip():
            close()
            paragraph, held, too_long = [], 0, False
            continue
        if not paragraph and not too_long:
            first = number
        held += MAX_LINE_BYTES + 1 if line is None else len(line)
        if held > MAX_LINE_BYTES:  # the paragraph is longer than any document may be: let go of it
            paragraph, too_long = [], True
        else:
            paragraph.append(_ending_stripped(line))
    close()
    collector.report.beyond_limit += _rest(handle)


def _read_jsonl(handle, field_name: str, collector: _Collector) -> None:
    for number, line in _lines(handle):
        if line is None:
            collector.report.too_long += 1
            continue
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
    collector.report.beyond_limit += _rest(handle)


class _CsvLines:
    """The lines a ``csv.reader`` reads, decoded one at a time: a line that is not UTF-8 marks the row it belongs
    to (``bad``); a row that spans more than MAX_LINE_BYTES (an unclosed quote) refuses the file."""

    def __init__(self, handle):
        self.handle, self.bad, self.row_bytes, self.lines = handle, False, 0, 0

    def __iter__(self):
        for number, line in _lines(self.handle):
            self.lines = number
            if line is None:
                raise CorpusRefused(f"the CSV file has a line of more than {MAX_LINE_BYTES // 1024**2} MB at line "
                                    f"{number:,}")
            self.row_bytes += len(line)
            if self.row_bytes > MAX_LINE_BYTES:
                raise CorpusRefused(f"the CSV file has a row of more than {MAX_LINE_BYTES // 1024**2} MB ending "
                                    f"at line {number:,} (an unclosed quote?)")
            text = _decoded(line)
            if text is None:  # the row is counted as undecodable; its other cells still parse
                self.bad = True
                text = line.decode("utf-8", errors="replace")
            yield text

    def next_row(self) -> None:
        self.bad, self.row_bytes = False, 0


def _read_csv(handle, column: str | None, collector: _Collector) -> None:
    csv.field_size_limit(MAX_DOCUMENT_CHARS * 4 + 1)
    lines = _CsvLines(handle)
    reader = csv.reader(iter(lines))
    try:
        header = next(reader)
    except (StopIteration, csv.Error) as problem:
        raise CorpusRefused("the CSV file has no header row") from problem
    index = _column_index(header, column)
    lines.next_row()
    try:
        for number, row in enumerate(reader, 2):
            cell = row[index] if index < len(row) else None
            if lines.bad:
                collector.report.undecodable += 1
            else:
                collector.offer(cell, f"row {number}")
            lines.next_row()
    except csv.Error as problem:
        if "field larger than field limit" in str(problem):
            raise CorpusRefused(f"the CSV file has a field of more than {MAX_DOCUMENT_CHARS * 4:,} characters ending "
                                f"at line {lines.lines:,} (an unclosed quote?)") from None
        raise CorpusRefused(f"the CSV file breaks at line {lines.lines:,}: {problem}") from problem
    collector.report.beyond_limit += _rest(handle)


def _column_index(header: list[str], column: str | None) -> int:
    wanted = column or (DEFAULT_FIELD if DEFAULT_FIELD in header else (header[0] if len(header) == 1 else None))
    if wanted is None or wanted not in header:
        raise CorpusRefused(f"choose the column that holds the text: this file has {', '.join(map(repr, header))}")
    return header.index(wanted)


# -- Parquet ------------------------------------------------------------------------------------------------------


def _parquet_file(source):
    """The file's footer read by pyarrow (no page yet), or a refusal in words."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(source, (str, Path)):
        size = Path(source).stat().st_size
        if size > max_corpus_bytes():
            raise CorpusRefused(f"the file is {size / 1024**2:,.1f} MB; a corpus may be at most "
                                f"{max_corpus_bytes() / 1024**2:,.0f} MB here")
    try:
        return pq.ParquetFile(source)
    except (pa.ArrowException, OSError, ValueError, MemoryError) as problem:
        raise CorpusRefused(f"the Parquet file cannot be read: {_without_path(problem, source)}") from None


def _is_text(kind) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def _parquet_text_columns(parquet) -> list[str]:
    """The top-level text columns of a Parquet file: what can hold a corpus's documents (not numbers, nor the
    parts of a nested column)."""
    return [column.name for column in parquet.schema_arrow if _is_text(column.type)]


def _read_parquet(source, column: str | None, collector: _Collector, limit: int) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(source, (str, Path)) and Path(source).stat().st_size > limit:
        size = Path(source).stat().st_size
        raise CorpusRefused(f"the file is {size / 1024**2:,.1f} MB; a corpus may be at most "
                            f"{limit / 1024**2:,.0f} MB here")
    parquet = _parquet_file(source)
    columns = _parquet_text_columns(parquet)
    wanted = column or (DEFAULT_FIELD if DEFAULT_FIELD in columns else (columns[0] if len(columns) == 1 else None))
    if wanted is None or wanted not in columns:
        raise CorpusRefused(f"choose the column that holds the text: this file has {', '.join(map(repr, columns))}")
    metadata = parquet.metadata
    leaf = next((i for i in range(metadata.num_columns) if metadata.schema.column(i).path == wanted), None)
    if leaf is None:
        raise CorpusRefused(f"the Parquet file's column {wanted!r} cannot be read as text")
    most = max_parquet_chunk_bytes()
    for group in range(metadata.num_row_groups):
        unpacked = metadata.row_group(group).column(leaf).total_uncompressed_size
        if unpacked > most:
            raise CorpusRefused(f"the Parquet file's column {wanted!r} decompresses to {unpacked / 1024**2:,.1f} MB "
                                f"in row group {group}; attnviz reads chunks of at most {most / 1024**2:,.0f} MB")
    number = 0
    try:
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[wanted], use_threads=False):
            values = batch.column(0)
            if pa.types.is_dictionary(values.type):  # lengths from the dictionary: no value copied per row
                lengths = pc.take(pc.utf8_length(values.dictionary), values.indices).to_pylist()
            else:
                lengths = pc.utf8_length(values).to_pylist()
            for index, length in enumerate(lengths):
                if number >= MAX_RECORDS:
                    collector.report.beyond_limit += metadata.num_rows - number
                    return
                number += 1
                if length is None:
                    collector.report.not_text += 1
                elif length > MAX_DOCUMENT_CHARS + 1024:  # counted without being made a Python string
                    collector.report.too_long += 1
                elif collector.full:
                    collector.report.past_characters += 1
                else:
                    try:
                        value = values[index].as_py()
                    except UnicodeDecodeError:  # a value that is not UTF-8 (a writer that did not check)
                        collector.report.undecodable += 1
                        continue
                    collector.offer(value, f"row {number}")
    except (pa.ArrowException, OSError, ValueError, MemoryError) as problem:
        raise CorpusRefused(f"the Parquet file cannot be read: {_without_path(problem, source)}") from None


def _without_path(problem: Exception, source) -> str:
    """A reader's message without the server's path of the file (the user knows the file by its name)."""
    text = (str(problem).splitlines() or [type(problem).__name__])[0]
    return text.replace(str(source), "the file") if isinstance(source, (str, Path)) else text


def columns_of(path: str | Path) -> list[str]:
    """The fields or columns a corpus file offers for its text (none for ``.txt``): what the page lets one choose."""
    suffix = format_of(str(path))
    if suffix == ".txt":
        return []
    if suffix == ".parquet":
        return _parquet_text_columns(_parquet_file(path))
    with open(path, "rb") as handle:
        head = handle.read(1_000_000)
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:]
    if suffix == ".csv":
        text = head.decode("utf-8", errors="replace")
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


def open_corpus(spec: str, *, split: str = "line", field_name: str | None = None, keep: int | None = None) -> Corpus:
    """The command line's corpus: :data:`BUNDLED`, or a file's path (its first ``keep`` documents kept in memory,
    every one counted and fingerprinted)."""
    if spec == BUNDLED:
        return bundled_corpus()
    if not Path(spec).is_file():
        raise CorpusRefused(f"no corpus file at {spec!r}")
    return read_corpus(spec, split=split, field_name=field_name, keep=keep)
