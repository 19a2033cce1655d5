"""Corpora for a scan: what one is (its documents, what reading it met, its fingerprint), its bounds, and the
bundled one (English that ships with Python). Files a user brings are read by :mod:`attnviz.corpus.document_files`.

A document that is empty, not valid UTF-8 (bad bytes, or a string with a lone surrogate, which no tokenizer
takes), not text or longer than :data:`MAX_DOCUMENT_CHARS` is counted in the :class:`CorpusReport` and left out,
never fatal. The documents together hold at most :func:`max_corpus_characters` characters (and the texts looked
at, blank ones included, twice that): from the first document that would pass it, every later one is counted and
left out. Whoever reads a corpus may keep only its first documents in memory (``keep``): every document is counted
and fingerprinted either way.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

FORMATS = (".txt", ".jsonl", ".csv", ".parquet")
MAX_DOCUMENT_CHARS = 100_000  # longer documents are counted and left out (a scan reads a few hundred tokens each)
MAX_RECORDS = 1_000_000  # lines (rows) read from a file; the rest are counted, not read
DEFAULT_CORPUS_CHARS = 100_000_000
CHARS_EVERY = 256  # the running character count is noted every this many documents (for disk estimates)
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
        return characters_noted(self.chars_every, self.characters, count)


def characters_noted(chars_every: list[int], characters: int | None, count: int) -> int:
    """At least the characters of a corpus's first ``count`` documents, from the running count a reader noted every
    :data:`CHARS_EVERY` documents (``chars_every``) and the total (``characters``, None if unknown)."""
    note = -(-count // CHARS_EVERY) - 1  # the first note at or after ``count`` documents
    if note < len(chars_every):
        return int(chars_every[note])
    return int(characters) if characters is not None else count * MAX_DOCUMENT_CHARS


class Collector:
    """What a reader offers goes here: counted, every document fingerprinted, the first ``keep`` kept (all:
    None)."""

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


# ---------------------------------------------------------------------------------------------------------------
# The bundled corpus


def bundled_corpus() -> Corpus:
    """English that ships with Python: its documentation topics (cut into documents of about
    TOPIC_DOCUMENT_CHARS) and the standard library's docstrings (one document each), shuffled with a fixed seed
    so that the first N documents mix both."""
    from attnviz.tiny_gpt.text import documentation_topics

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
    collector = Collector()
    for document in documents:
        collector.offer(document.text, document.source)
    return collector.corpus(BUNDLED)


@functools.lru_cache(maxsize=1)
def kept_docstrings() -> list[tuple[str, str]]:
    """The standard library's docstrings (:func:`attnviz.tiny_gpt.text.parse_docstrings`, 10-20 s to parse), kept in
    a private file of this account's in the temporary folder per Python version, and read from there next time
    (not kept where that folder is not safe: a link, another account's, writable by others)."""
    from attnviz.checkpoints.disk import private_folder
    from attnviz.tiny_gpt.text import parse_docstrings

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
