"""Does a head matter across a corpus? The importance maps of :mod:`attnviz.interventions.importance` over thousands of
documents: each document's effect of ablating each head (zero, mean) and its gradient importance, a chunk of
documents at a time, into DuckDB (:mod:`attnviz.corpus.importance.store`), in a process of its own when the page
starts it, resumable, and on Ray when asked (:mod:`attnviz.corpus.importance.on_ray`) with the same results.

Mean ablation over a corpus puts in each head's mean over every token of the corpus, so a run makes two passes:
one forward per chunk for the means (kept once the pass ends; a run stopped during it starts it again), then the
heads' effects.

The command line is :mod:`attnviz.corpus.importance`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from attnviz.corpus.document_files import open_corpus
from attnviz.corpus.documents import CHARS_EVERY, MAX_RECORDS, Corpus, CorpusRefused, Document, max_corpus_characters
from attnviz.corpus.importance import store as istore
from attnviz.corpus.options import option
from attnviz.corpus.runner import (
    ChunkWork,
    Documents,
    Measure,
    Progress,
    Stopped,
    chunks,
    open_results,
    pending,
    report,
    run_chunks,
)
from attnviz.corpus.scan.runner import ScanRefused, model_fingerprint
from attnviz.interventions import importance as imp
from attnviz.interventions.edits import AttentionModule, attention_modules, editable_checkpoint

SCAN_PREFIX = "scan:"
METHODS = ("zero", "mean", "gradient")


@dataclass(frozen=True)
class ImportanceSettings:
    """What a corpus importance run reads and measures; its fields are also the JSON a background run is given and
    the options of ``python -m attnviz.corpus.importance`` (:mod:`attnviz.corpus.options`)."""

    max_docs: int = field(default=200, metadata=option("the corpus's first documents read"))
    max_tokens: int = field(default=64, metadata=option("each document's first tokens read, special tokens included"))
    chunk_docs: int = field(default=16, metadata=option(
        "documents per committed chunk (and Ray batch): what a stop may lose", flag="--chunk"))
    methods: tuple[str, ...] = field(default=METHODS, metadata=option("comma-separated: zero, mean, gradient"))

    def __post_init__(self):
        if self.max_docs < 1 or self.max_tokens < 2 or not 1 <= self.chunk_docs <= imp.MAX_TEXTS:
            raise ScanRefused(f"a run reads at least 1 document of at least 2 tokens, in chunks of 1 to "
                              f"{imp.MAX_TEXTS} documents")
        if self.max_tokens > imp.MAX_TOKENS:
            raise ScanRefused(f"at most {imp.MAX_TOKENS} tokens per document: a run is one forward per head")
        unknown = set(self.methods) - set(METHODS)
        if unknown or not self.methods:
            raise ScanRefused(f"methods are {', '.join(METHODS)}, not {', '.join(sorted(unknown)) or 'none'}")


DEFAULT_SETTINGS = ImportanceSettings()


@dataclass
class ImportanceProgress(Progress):
    phase: str = "means"  # "means": the corpus means (mean ablation); "heads": the effects


def scan_documents(path: str | Path) -> Corpus:
    """The documents a scan read (its ``documents`` table, in order), as a corpus."""
    from attnviz.corpus.scan.store import ScanReader

    try:
        with ScanReader(path) as reader:
            count, characters = reader.connection.execute(
                "SELECT count(*), coalesce(sum(length(text)), 0) FROM documents").fetchone()
            if count > MAX_RECORDS or characters > max_corpus_characters():
                raise CorpusRefused(f"{Path(path).name} holds {count:,} documents of {characters:,} characters: a "
                                    f"corpus read here holds at most {MAX_RECORDS:,} documents and "
                                    f"{max_corpus_characters():,} characters")
            rows = reader.connection.execute("SELECT text, source FROM documents ORDER BY doc").fetchall()
            name = f"the documents of scan {reader.settings.get('key', Path(path).stem)}"
    except CorpusRefused:
        raise
    except Exception as problem:  # noqa: BLE001 - any DuckDB error, or a file that is not a scan: refused
        said = str(problem) if isinstance(problem, ValueError) else type(problem).__name__
        raise CorpusRefused(f"{Path(path).name} is not a scan's database this can read ({said})") from None
    return Corpus(name, [Document(text, source) for text, source in rows])


def scan_corpus_facts(path: str | Path) -> Corpus:
    """The documents of a scan as :func:`scan_documents` reads them, without their texts: how many, their
    fingerprint (each text's SHA-256 computed by DuckDB, streamed) and their characters. What a page needs to name a
    run, in memory of a few rows at a time."""
    from attnviz.corpus.scan.store import ScanReader

    digest, every, characters, count = hashlib.sha256(), [], 0, 0
    try:
        with ScanReader(path) as reader:
            name = f"the documents of scan {reader.settings.get('key', Path(path).stem)}"
            cursor = reader.connection.cursor()
            cursor.execute("SELECT sha256(text), length(text) FROM documents ORDER BY doc")
            while rows := cursor.fetchmany(10_000):
                for hashed, length in rows:
                    digest.update(bytes.fromhex(hashed))
                    count, characters = count + 1, characters + int(length)
                    if count % CHARS_EVERY == 0:
                        every.append(characters)
    except Exception as problem:  # noqa: BLE001 - any DuckDB error, or a file that is not a scan: refused
        said = str(problem) if isinstance(problem, ValueError) else type(problem).__name__
        raise CorpusRefused(f"{Path(path).name} is not a scan's database this can read ({said})") from None
    return Corpus(name, [], size=count, digest=digest.hexdigest(), chars_every=every, characters=characters)


def read_corpus_spec(spec: str, *, split: str = "line", field_name: str | None = None,
                     keep: int | None = None) -> Corpus:
    """``bundled``, a corpus file, or ``scan:FILE`` (the documents a scan read); a file's first ``keep`` documents
    kept in memory (every one counted and fingerprinted)."""
    if spec.startswith(SCAN_PREFIX):
        return scan_documents(spec[len(SCAN_PREFIX):])
    return open_corpus(spec, split=split, field_name=field_name, keep=keep)


def importance_key(corpus: Corpus | str, folder: str | Path, settings: ImportanceSettings,
                   dtype: str = "stored") -> str:
    """The same corpus, model, dtype and limits give the same key (and the page the same file): reused, or resumed.
    A run in fp32 of a half-precision checkpoint is another run: it never resumes one made as stored."""
    fingerprint = corpus if isinstance(corpus, str) else corpus.fingerprint
    wanted = {"corpus": fingerprint, "model": model_fingerprint(folder), "max_docs": settings.max_docs,
              "max_tokens": settings.max_tokens, "methods": sorted(settings.methods),
              "schema": istore.SCHEMA_VERSION, **({} if dtype == "stored" else {"dtype": dtype})}
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:24]


def methods_for(objective: str, settings: ImportanceSettings) -> list[str]:
    """The methods a run measures: gradient importance needs a loss."""
    return [method for method in settings.methods if not (method == "gradient" and objective == "hidden")]


def _texts(documents: Documents) -> Documents:
    return [(doc, document) for doc, document in documents if document.text.strip()]


def corpus_means(model, tokenizer, objective: str, documents: Documents,
                 settings: ImportanceSettings, should_stop: Callable[[], bool] | None = None,
                 progress: Callable[[int], None] | None = None) -> dict[str, torch.Tensor]:
    """Each head's output averaged over every real token of the documents (their copies, under the masked-LM
    objective): ``[heads, d_v]`` by module name. One forward per chunk."""
    sums: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    count = 0
    for chunk in chunks(_texts(documents), settings.chunk_docs):
        if should_stop is not None and should_stop():
            raise Stopped
        batch = imp.batch_of(tokenizer, [document.text for _, document in chunk], objective, settings.max_tokens)
        means, tokens = imp.head_means_of(model, batch)
        for name, mean in means.items():
            sums[name] = sums.get(name, 0) + mean.double() * tokens
            dtypes[name] = mean.dtype
        count += tokens
        if progress is not None:
            progress(len(chunk))
    # in the model's own dtype (float32 for the stored tiny GPT; a float64 model keeps float64 means)
    return {name: (total / max(count, 1)).to(dtypes[name]) for name, total in sums.items()}


def measure_chunk(model, tokenizer, objective: str, modules: list[AttentionModule],
                  documents: Documents, settings: ImportanceSettings,
                  means: dict[str, torch.Tensor] | None,
                  should_stop: Callable[[], bool] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One chunk's rows: ``documents`` (doc, source, text, n_tokens, truncated, clean) and ``effects`` (doc,
    method, module, head, value; None where a document has nothing to predict). An empty document is kept with
    no effects. ``should_stop`` is asked at every head: :class:`Stopped` drops the chunk."""
    def check(_share, _what):
        if should_stop is not None and should_stop():
            raise Stopped

    kept = _texts(documents)
    clean = {doc: None for doc, _ in documents}
    tokens, truncated = {doc: 0 for doc, _ in documents}, {doc: False for doc, _ in documents}
    effects = []
    if kept:
        batch = imp.batch_of(tokenizer, [document.text for _, document in kept], objective, settings.max_tokens)
        first_copy = batch.real[: len(kept)].sum(-1).tolist()
        for index, (doc, _) in enumerate(kept):
            tokens[doc], truncated[doc] = int(first_copy[index]), bool(batch.cut[index])
        for method in methods_for(objective, settings):
            if method == "gradient":
                check(0, "")
                found = imp.gradient_importance(model, batch, objective=objective, modules=modules)
            else:
                found = imp.ablation_map(model, batch, method, objective=objective, modules=modules, progress=check,
                                         means=means if method == "mean" else None)
                for index, (doc, _) in enumerate(kept):
                    value = float(found.clean_per_text[index])
                    clean[doc] = None if value != value else value
            for row, module in enumerate(modules):
                for head in range(module.heads):
                    for index, (doc, _) in enumerate(kept):
                        value = float(found.per_text[row, head, index])
                        effects.append((doc, method, row, head, None if value != value else value))
    rows = pd.DataFrame([(doc, document.source, document.text, tokens[doc], truncated[doc], clean[doc])
                         for doc, document in documents],
                        columns=["doc", "source", "text", "n_tokens", "truncated", "clean"])
    return rows, pd.DataFrame(effects, columns=["doc", "method", "module", "head", "value"])


def open_run(path: str | Path, corpus: Corpus, folder: str | Path, name: str, settings: ImportanceSettings,
             objective: str, modules: list[AttentionModule], source: str | None = None,
             dtype: str = "stored") -> istore.ImportanceWriter:
    """The run's database: new (its settings written), or the same run's to resume; refused if it holds another."""
    key = importance_key(corpus, folder, settings, dtype)
    writer, new = open_results(istore.ImportanceWriter, path, key, "run", ScanRefused)
    if new:
        writer.set(key=key, model=name, model_folder=str(folder), objective=objective, source=source,
                   objective_words=imp.OBJECTIVES[objective], corpus=corpus.name,
                   corpus_fingerprint=corpus.fingerprint, corpus_documents=corpus.count,
                   max_docs=settings.max_docs, max_tokens=settings.max_tokens,
                   methods=methods_for(objective, settings), planned=min(settings.max_docs, corpus.count),
                   versions=istore.versions(), started=time.time(), status=istore.STATUS_RUNNING)
    writer.write_modules(modules)
    return writer


def prepare(model, tokenizer, corpus: Corpus, settings: ImportanceSettings):
    """What every run needs before its first chunk: the objective and the attention modules, as the model calls
    them on the corpus's first document."""
    objective = imp.objective_of(model)
    planned = list(enumerate(corpus.documents[: settings.max_docs]))
    with_text = _texts(planned)
    if not with_text:
        raise CorpusRefused("the corpus holds no document to measure")
    first = imp.batch_of(tokenizer, [with_text[0][1].text], objective, settings.max_tokens)
    return objective, planned, attention_modules(model, first.inputs)


def importance_replica(folder: str, dtype: str, objective: str, settings: ImportanceSettings,
                       means: dict[str, torch.Tensor] | None) -> Callable[[Documents], tuple]:
    """:func:`measure_chunk` in another process (a Ray actor), with its own replica of the checkpoint in ``folder``
    loaded in ``dtype``; its attention modules as the model calls them on a two-word probe."""
    model, tokenizer, _ = editable_checkpoint(folder, dtype)
    probe = imp.batch_of(tokenizer, ["a b"], objective, settings.max_tokens)
    modules = attention_modules(model, probe.inputs)
    return lambda documents: measure_chunk(model, tokenizer, objective, modules, documents, settings, means)


def run_importance(corpus: Corpus, folder: str | Path, path: str | Path,
                   settings: ImportanceSettings = DEFAULT_SETTINGS, *, name: str | None = None,
                   dtype: str = "stored", loaded: tuple | None = None, source: str | None = None,
                   progress: Callable[[ImportanceProgress], None] | None = None,
                   should_stop: Callable[[], bool] | None = None, measure: Measure | None = None) -> ImportanceProgress:
    """Measure every head of the checkpoint in ``folder`` over ``corpus`` into the database at ``path`` (created, or
    resumed where it stopped). ``loaded``: ``(model, tokenizer)`` already loaded (else loaded here); ``source``: the
    corpus as the command line names it (kept in the settings: a scan's documents link the run to the scan);
    ``measure``: where the heads' chunks are measured (default: here, one after the other, a stop asked at every
    head; :func:`attnviz.corpus.on_ray.on_ray`: on Ray). Returns the last progress (``status`` finished or
    stopped)."""
    model, tokenizer = loaded if loaded is not None else editable_checkpoint(folder, dtype)[:2]
    objective, planned, modules = prepare(model, tokenizer, corpus, settings)
    with open_run(path, corpus, folder, name or Path(folder).name, settings, objective, modules,
                  source, dtype) as writer:
        todo = pending(planned, writer.done_documents())
        state = ImportanceProgress(done=len(planned) - len(todo), planned=len(planned), started=time.time())
        writer.set(status=istore.STATUS_RUNNING)
        try:
            means = kept_means(writer, model, tokenizer, objective, modules, planned, settings, state, progress,
                               should_stop)
            state.phase = "heads"
            report(progress, state)
            work = ChunkWork(
                here=lambda chunk: measure_chunk(model, tokenizer, objective, modules, chunk, settings, means,
                                                 should_stop),
                replica=functools.partial(importance_replica, str(folder), dtype, objective, settings, means),
                chunk_docs=settings.chunk_docs)
            run_chunks(work, todo, lambda _chunk, measured: record_rows(writer, state, *measured), state,
                       measure=measure, progress=progress, should_stop=should_stop)
            state.status = istore.STATUS_FINISHED
        except Stopped:
            state.status = istore.STATUS_STOPPED
        writer.set(status=state.status, finished=time.time() if state.status == istore.STATUS_FINISHED else None)
    report(progress, state)
    return state


def kept_means(writer: istore.ImportanceWriter, model, tokenizer, objective: str, modules: list[AttentionModule],
               planned: Documents, settings: ImportanceSettings, state: ImportanceProgress,
               progress: Callable | None, should_stop: Callable[[], bool] | None) -> dict[str, torch.Tensor] | None:
    """The corpus means mean ablation puts in: as a finished means pass kept them, else measured now (one forward
    per chunk, in this process) and kept; None when the run does not ablate by the mean."""
    means = writer.means(modules)
    if means is None and "mean" in methods_for(objective, settings):
        state.phase = "means"
        report(progress, state)
        means = corpus_means(model, tokenizer, objective, planned, settings, should_stop)
        writer.write_means(modules, means)
    return means


def record_rows(writer: istore.ImportanceWriter, state: ImportanceProgress, rows: pd.DataFrame,
                effects: pd.DataFrame) -> None:
    """One chunk's documents and effects committed; counted in ``state``."""
    writer.commit(rows, effects)
    state.done += len(rows)
    state.done_this_run += len(rows)
    state.tokens_this_run += int(rows["n_tokens"].sum())
