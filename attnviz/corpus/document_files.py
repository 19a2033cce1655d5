"""Corpus files a user brings, read by a real reader for their format (never executed): ``.txt`` (one document per
line, or per blank-line-separated paragraph), ``.jsonl`` (a string field, ``text`` by default), ``.csv`` (a chosen
column) and ``.parquet`` (a chosen top-level text column, read by pyarrow). A file over
:func:`attnviz.corpus.documents.max_corpus_bytes` is refused as a whole; each document is offered to a
:class:`attnviz.corpus.documents.Collector`, which counts, bounds and keeps.

Reading is bounded by what a file decodes to, not by its size in bytes (a few hundred bytes of Parquet can decode
to gigabytes, a few megabytes of short lines to millions of objects):

* files are streamed, a line (at most :data:`MAX_LINE_BYTES`) or :data:`PARQUET_BATCH_ROWS` Parquet rows at a time:
  nothing holds the whole file;
* at most :data:`attnviz.corpus.documents.MAX_RECORDS` lines (rows, for CSV and Parquet) are read; the rest are counted,
  not parsed;
* a Parquet column chunk may decompress to at most :func:`max_parquet_chunk_bytes`, checked in the file's footer
  before a page is read, and a value longer than a document may be is counted without being made a string.

The page reads a file's facts in a child process with a memory and CPU cap (:mod:`attnviz.corpus.document_probe`),
once per file.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

from attnviz.corpus.documents import (
    BUNDLED,
    MAX_DOCUMENT_CHARS,
    MAX_RECORDS,
    Collector,
    Corpus,
    CorpusRefused,
    bundled_corpus,
    format_of,
    max_corpus_bytes,
)

TXT_SPLITS = ("line", "paragraph")  # one document per line, or per blank-line-separated paragraph
DEFAULT_FIELD = "text"
MAX_LINE_BYTES = 4 * 1024**2  # a longer line (or paragraph, or CSV row) is counted as too long, never held whole
DEFAULT_PARQUET_CHUNK_MB = 256  # what one column chunk of a Parquet file may decompress to
PARQUET_BATCH_ROWS = 64  # rows decoded at once (a few MB; each value's length is checked before it is a string)


def max_parquet_chunk_bytes() -> int:
    """What one column chunk of a Parquet corpus may decompress to (``ATTNVIZ_PARQUET_CHUNK_MB``, 256)."""
    try:
        return int(max(1.0, float(os.environ.get("ATTNVIZ_PARQUET_CHUNK_MB", DEFAULT_PARQUET_CHUNK_MB))) * 1024**2)
    except ValueError:
        return DEFAULT_PARQUET_CHUNK_MB * 1024**2


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
    collector = Collector(keep)
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


def _read_txt(handle, split: str, collector: Collector) -> None:
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


def _read_jsonl(handle, field_name: str, collector: Collector) -> None:
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


def _read_csv(handle, column: str | None, collector: Collector) -> None:
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


def _parquet_file(source, limit: int | None = None):
    """The file's footer read by pyarrow (no page yet), or a refusal in words; a file over ``limit`` (default:
    :func:`attnviz.corpus.documents.max_corpus_bytes`) is refused first."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    limit = max_corpus_bytes() if limit is None else limit
    if isinstance(source, (str, Path)):
        size = Path(source).stat().st_size
        if size > limit:
            raise CorpusRefused(f"the file is {size / 1024**2:,.1f} MB; a corpus may be at most "
                                f"{limit / 1024**2:,.0f} MB here")
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


def _read_parquet(source, column: str | None, collector: Collector, limit: int) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    parquet = _parquet_file(source, limit)
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


def open_corpus(spec: str, *, split: str = "line", field_name: str | None = None, keep: int | None = None) -> Corpus:
    """The command line's corpus: :data:`BUNDLED`, or a file's path (its first ``keep`` documents kept in memory,
    every one counted and fingerprinted)."""
    if spec == BUNDLED:
        return bundled_corpus()
    if not Path(spec).is_file():
        raise CorpusRefused(f"no corpus file at {spec!r}")
    return read_corpus(spec, split=split, field_name=field_name, keep=keep)
