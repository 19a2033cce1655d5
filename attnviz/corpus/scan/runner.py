"""Scan a model over a corpus, in this process: documents in chunks, each chunk's partial merged into the
running aggregate and committed to the scan's database in one transaction, so a scan stopped at any point resumes
from its last chunk and gives the same tables as one that ran through. The chunks go through the one runner of
corpus runs (:func:`attnviz.corpus.runner.run_chunks`), here or on a Ray cluster (:mod:`attnviz.corpus.scan.on_ray`).

Each document is captured by :func:`attnviz.models.capture.capture` (the model's own forward on its fast path,
every attention call recorded) and every layer's weights replayed at once (``[layers, heads, n, n]``, at most
``max_tokens`` a side): any checkpoint attnviz reads can be scanned. A document whose weights are not finite is
listed with its problem and left out of every statistic.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from attnviz.corpus.documents import Corpus, Document
from attnviz.corpus.options import option
from attnviz.corpus.runner import (
    ChunkWork,
    Documents,
    Measure,
    Progress,
    StopAsked,
    Stopped,
    open_results,
    pending,
    report,
    run_chunks,
)
from attnviz.corpus.scan import disk, qk_sample, store
from attnviz.corpus.scan.heads import CRITERIA, Partial, document_partial
from attnviz.models.capture import capture
from attnviz.models.loading import ModelBundle
from attnviz.models.record import dense_token_limit

NONFINITE = "its attention weights hold NaN or infinity (the model overflows on it): left out of every statistic"
REFUSED_BY_TOKENIZER = "the tokenizer cannot read this text: left out of every statistic"
SCANNED_KINDS = ("self", "encoder")  # the self-attention over the input text: decoders' and encoders'


class ScanRefused(ValueError):
    """The scan cannot run as asked (a model that reads images, a file that holds another scan); says why."""


@dataclass(frozen=True)
class ScanSettings:
    """What a scan reads and keeps; its fields are also the JSON a background scan is given and the options of
    ``python -m attnviz.corpus.scan`` (:mod:`attnviz.corpus.options`)."""

    max_docs: int = field(default=1_000, metadata=option("the corpus's first documents read"))
    max_tokens: int = field(default=128, metadata=option("each document's first tokens read, special tokens "
                                                         "included"))
    chunk_docs: int = field(default=64, metadata=option(
        "documents per committed chunk (and Ray batch): what a stop may lose", flag="--chunk"))
    qk_points: int = field(default=qk_sample.DEFAULT_POINTS, metadata=option(
        "tokens per head whose queries, keys and values are kept for the Queries and keys page (whole documents "
        "drawn evenly across the corpus; 0: none)", metavar="N"))

    def __post_init__(self):
        if self.max_docs < 1 or self.max_tokens < 2 or self.chunk_docs < 1:
            raise ScanRefused("a scan reads at least 1 document of at least 2 tokens, in chunks of at least 1")
        if not 0 <= self.qk_points <= qk_sample.MOST_POINTS:
            raise ScanRefused(f"a scan keeps between 0 and {qk_sample.MOST_POINTS:,} queries and keys per head")


DEFAULT_SETTINGS = ScanSettings()


def model_fingerprint(folder: str | Path) -> str:
    """What identifies a checkpoint cheaply: its config, and each weight file's name, size and first 64 KB."""
    folder = Path(folder)
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.name == "config.json" or path.suffix == ".safetensors":
            digest.update(path.name.encode())
            digest.update(str(path.stat().st_size).encode())
            with open(path, "rb") as handle:
                digest.update(handle.read(65_536))
    return digest.hexdigest()


def scan_key(corpus: Corpus | str, folder: str | Path, settings: ScanSettings, dtype: str = "float32") -> str:
    """The same corpus (or its fingerprint), model, dtype (as loaded) and limits give the same key (and the page the
    same file): reused, or resumed. A half-precision checkpoint scanned in fp32 is another scan: it never resumes one
    made as stored."""
    fingerprint = corpus if isinstance(corpus, str) else corpus.fingerprint
    wanted = {"corpus": fingerprint, "model": model_fingerprint(folder), "max_docs": settings.max_docs,
              "max_tokens": settings.max_tokens, "schema": store.SCHEMA_VERSION, "qk_points": settings.qk_points,
              **({} if dtype == "float32" else {"dtype": dtype})}
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:24]


def scanned_kind(bundle: ModelBundle) -> tuple[str, int, int]:
    """(attention kind, layers, heads) that a scan reads: the self-attention over the input text."""
    if bundle.modality != "text":
        raise ScanRefused(f"{bundle.name} reads images; a scan reads a corpus of text")
    records = capture(bundle, "a b", max_tokens=8).records
    for kind in SCANNED_KINDS:
        if kind in records:
            return kind, records[kind].n_layers, records[kind].n_heads
    raise ScanRefused(f"{bundle.name} has no self-attention over its input that a scan could read")


def token_limit(n_layers: int, n_heads: int) -> int:
    """The most tokens per document a scan reads with a model of this shape: a document's
    ``[layers, heads, n, n]`` weights are read in one piece, bounded like the dense views (see
    :func:`attnviz.models.record.dense_token_limit`)."""
    return dense_token_limit(n_layers, n_heads)


def check_token_limit(settings: ScanSettings, n_layers: int, n_heads: int) -> None:
    """Refuse, in words, documents longer than :func:`token_limit`."""
    limit = token_limit(n_layers, n_heads)
    if settings.max_tokens > limit:
        raise ScanRefused(f"{settings.max_tokens:,} tokens per document x {n_layers} layers x {n_heads} heads: a scan "
                          f"reads every layer's weights of a document at once, up to {limit:,} tokens for this model")


def read_document(bundle: ModelBundle, kind: str, doc: int, document: Document,
                  max_tokens: int) -> tuple[int, object, torch.Tensor | None, str | None]:
    """One document captured and every layer's weights replayed at once: (doc, capture, ``[layers, heads, n, n]``
    weights, None), or (doc, None, None, why it was left out)."""
    try:
        result = capture(bundle, document.text, max_tokens=max_tokens, check_finite=False)
    except ValueError as problem:  # a tokenizer that does not fit its model, an empty text after all
        return doc, None, None, str(problem)
    except (TypeError, UnicodeError) as problem:  # text the tokenizer refuses: this document only is left out
        return doc, None, None, f"{REFUSED_BY_TOKENIZER} ({type(problem).__name__})"
    weights = result.records[kind].every_layer_weights()  # self-attention over the input: queries = result.tokens
    # One NaN would spoil every sum of its heads. Weights lie in [0, 1], so their sum is finite exactly when every
    # weight is (NaN and infinities carry into it): one reduction, no [layers, heads, n, n] mask.
    if not bool(torch.isfinite(weights.sum())):
        return doc, None, None, NONFINITE
    return doc, result, weights, None


def text_as_read(bundle: ModelBundle, text: str, max_tokens: int) -> str:
    """The part of ``text`` that a scan read (its first ``max_tokens`` tokens, special tokens included), cut where
    its last token ends: read again without a limit it gives the same tokens, so Explore heads shows the weights
    the scan measured (but where a BPE merges the cut's last characters otherwise: 1 of the bundled corpus's first
    200 documents at 64 tokens with the tiny GPT, none with the BERT). The whole text where the tokenizer gives no
    character offsets (a stand-in tokenizer)."""
    try:
        encoded = bundle.tokenizer(text, truncation=True, max_length=max_tokens, return_offsets_mapping=True,
                                   return_special_tokens_mask=True)
        ends = [end for (_, end), special in zip(encoded["offset_mapping"], encoded["special_tokens_mask"],
                                                 strict=True) if not special]
    except (NotImplementedError, TypeError, ValueError, KeyError, AttributeError):
        return text
    return text[:max(ends)] if ends else text


def add_document(partial: Partial, read: tuple, floors: np.ndarray) -> None:
    """A document read by :func:`read_document` added to ``partial`` (a chunk's), or listed with its problem."""
    doc, result, weights, problem = read
    if problem is None:
        record = next(result.records[kind] for kind in SCANNED_KINDS if kind in result.records)
    if problem is not None:
        partial.documents.append({"doc": doc, "n_tokens": 0, "truncated": False, "problem": problem})
        return
    allowed = torch.stack([record.mask_rows(layer).sum(-1) for layer in range(record.n_layers)])  # [layers, n]
    document_partial(doc, weights, result.tokens, result.display_tokens, result.special, result.token_ids,
                     result.truncated, floors=floors, into=partial, separators=result.separators_of(result.tokens),
                     allowed=allowed)


def scan_chunk(bundle: ModelBundle, kind: str, documents: Documents, max_tokens: int, n_layers: int, n_heads: int,
               floors: np.ndarray | None = None) -> Partial:
    """The partial of a chunk of documents (doc number, document), each captured and all its layers read at
    once. ``floors``: the running aggregate's (:meth:`Partial.floors`), so examples that cannot enter its heaps
    are skipped."""
    partial = Partial(n_layers, n_heads)
    floors = np.full((n_layers, n_heads, len(CRITERIA)), -np.inf) if floors is None else floors.copy()
    for doc, document in documents:
        add_document(partial, read_document(bundle, kind, doc, document, max_tokens), floors)
    return partial


def scan_replica(folder: str, dtype: str, kind: str, max_tokens: int, n_layers: int,
                 n_heads: int) -> Callable[[Documents], Partial]:
    """:func:`scan_chunk` in another process (a Ray actor), with its own replica of the model loaded from
    ``folder`` in ``dtype`` (stored or fp32, as the scan's model was asked for)."""
    from attnviz.models.loading import load_model_dir

    bundle = load_model_dir(folder, dtype=dtype)
    return lambda documents: scan_chunk(bundle, kind, documents, max_tokens, n_layers, n_heads)


def planned_documents(corpus: Corpus, settings: ScanSettings) -> Documents:
    return list(enumerate(corpus.documents[:settings.max_docs]))


def resume(writer: store.ScanWriter, corpus: Corpus, settings: ScanSettings, n_layers: int,
           n_heads: int) -> tuple[Documents, Progress, Partial]:
    """What is left to scan, the progress so far and the aggregate as last committed; the scan marked running."""
    planned = planned_documents(corpus, settings)
    todo = pending(planned, writer.done_documents())
    state = Progress(done=len(planned) - len(todo), planned=len(planned), started=time.time(),
                     finished_before=writer.settings().get("status") == store.STATUS_FINISHED)
    partial = writer.load_partial(n_layers, n_heads)
    writer.set(status=store.STATUS_RUNNING)
    return todo, state, partial


def open_writer(path: str | Path, corpus: Corpus, bundle: ModelBundle, settings: ScanSettings, kind: str,
                n_layers: int, n_heads: int) -> store.ScanWriter:
    """The scan's database: new (its settings written), or the same scan's to resume. Refused if the file holds
    another scan."""
    key = scan_key(corpus, bundle.folder, settings, bundle.dtype)
    writer, new = open_results(store.ScanWriter, path, key, "scan", ScanRefused)
    if new:
        writer.set(key=key, model=bundle.name, model_folder=str(bundle.folder), model_type=bundle.model_type,
                   tokenizer=type(bundle.tokenizer).__name__, kind=kind, n_layers=n_layers, n_heads=n_heads,
                   corpus=corpus.name, corpus_fingerprint=corpus.fingerprint,
                   corpus_documents=corpus.count, corpus_report=corpus.report.lines(),
                   max_docs=settings.max_docs, max_tokens=settings.max_tokens, qk_points=settings.qk_points,
                   planned=min(settings.max_docs, corpus.count), versions=store.versions(),
                   started=time.time(), status=store.STATUS_RUNNING)
    return writer


def run_scan(corpus: Corpus, bundle: ModelBundle, path: str | Path, settings: ScanSettings = DEFAULT_SETTINGS, *,
             progress: Callable[[Progress], None] | None = None, should_stop: StopAsked = None,
             measure: Measure | None = None, dtype: str = "stored") -> Progress:
    """Scan ``bundle`` over ``corpus`` into the database at ``path`` (created, or resumed where it stopped).
    ``progress`` is called after every chunk; ``should_stop`` is asked between chunks: a stopped scan keeps what it
    committed and resumes on the next call. ``measure``: where the chunks are scanned (default: here, one after the
    other; :func:`attnviz.corpus.on_ray.on_ray`: on Ray, each actor loading the model in ``dtype``). Returns the
    last progress (``status`` finished or stopped)."""
    kind, n_layers, n_heads = scanned_kind(bundle)
    check_token_limit(settings, n_layers, n_heads)
    with open_writer(path, corpus, bundle, settings, kind, n_layers, n_heads) as writer:
        todo, state, partial = resume(writer, corpus, settings, n_layers, n_heads)
        work = ChunkWork(
            here=lambda chunk: scan_chunk(bundle, kind, chunk, settings.max_tokens, n_layers, n_heads,
                                          partial.floors()),
            replica=functools.partial(scan_replica, str(bundle.folder), dtype, kind, settings.max_tokens, n_layers,
                                      n_heads),
            chunk_docs=settings.chunk_docs)
        try:
            run_chunks(work, todo, lambda chunk, part: record_chunk(writer, partial, part, dict(chunk), state), state,
                       measure=measure, progress=progress, should_stop=should_stop)
        except Stopped:
            state.status = store.STATUS_STOPPED
        finish(writer, state, keep_sample(writer, bundle, kind, corpus, settings, state, progress, should_stop))
    if state.status == store.STATUS_FINISHED and not state.finished_before:  # copied compactly, grouped on the way
        disk.rewrite_compactly(path)
    report(progress, state)
    return state


def record_chunk(writer: store.ScanWriter, partial: Partial, part: Partial, documents: dict[int, Document],
                 state: Progress) -> None:
    """Merge a chunk's partial into the running one and commit it; count it in ``state``. (On this thread: on a
    thread of its own, the commit took the CPU that the next chunk's forward needed, and the scan was no
    faster.)"""
    state.done_this_run += len(part.documents)
    state.tokens_this_run += sum(entry["n_tokens"] for entry in part.documents)
    partial.merge(part)
    writer.commit(partial, {doc: (document.source, document.text) for doc, document in documents.items()})
    state.done += len(documents)


def keep_sample(writer: store.ScanWriter, bundle: ModelBundle, kind: str, corpus: Corpus, settings: ScanSettings,
                state: Progress, progress: Callable[[Progress], None] | None,
                should_stop: StopAsked) -> Callable[[], bool]:
    """What :func:`finish` runs once every document is scanned: the sample of queries and keys
    (:mod:`attnviz.corpus.scan.qk_sample`, in this process on Ray too: a few dozen forwards), reported in ``state``."""

    def sampled(done: int, planned: int) -> None:
        state.sampled, state.sample_planned = done, planned
        report(progress, state)

    def sample() -> bool:
        if not settings.qk_points:
            return True
        texts = {doc: document.text for doc, document in planned_documents(corpus, settings)}
        return qk_sample.record_sample(writer.connection, bundle, kind, texts, settings.qk_points,
                                       settings.max_tokens, should_stop=should_stop, progress=sampled)

    return sample


def finish(writer: store.ScanWriter, state: Progress, sample: Callable[[], bool] | None = None) -> None:
    """The scan marked finished (``sample`` run first: a stop there leaves it stopped, to resume) or stopped. A
    scan this run finished is then copied with :func:`disk.rewrite_compactly`, which groups its parts."""
    if state.status != store.STATUS_STOPPED and sample is not None and not sample():
        state.status = store.STATUS_STOPPED
    if state.status != store.STATUS_STOPPED:
        state.status = store.STATUS_FINISHED
    writer.set(status=state.status, finished=time.time() if state.status == store.STATUS_FINISHED else None)
