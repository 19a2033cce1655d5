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

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from attnviz.corpus.document_files import open_corpus
from attnviz.corpus.documents import CHARS_EVERY, MAX_RECORDS, Corpus, CorpusRefused, Document, max_corpus_characters
from attnviz.corpus.importance import store as istore
from attnviz.corpus.scan.runner import Progress, ScanRefused, chunks, model_fingerprint
from attnviz.interventions import importance as imp
from attnviz.interventions.edits import AttentionModule, attention_modules, editable_checkpoint

SCAN_PREFIX = "scan:"
METHODS = ("zero", "mean", "gradient")


@dataclass(frozen=True)
class ImportanceSettings:
    max_docs: int = 200  # the corpus's first documents measured
    max_tokens: int = 64  # each document's first tokens read
    chunk_docs: int = 16  # documents per committed chunk (and per Ray batch): what a stop may lose
    methods: tuple[str, ...] = METHODS

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


class Stopped(Exception):
    """Asked to stop in the middle of a chunk: the chunk is dropped, the run resumes from it."""


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


def _texts(documents: list[tuple[int, Document]]) -> list[tuple[int, Document]]:
    return [(doc, document) for doc, document in documents if document.text.strip()]


def corpus_means(model, tokenizer, objective: str, documents: list[tuple[int, Document]],
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
                  documents: list[tuple[int, Document]], settings: ImportanceSettings,
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
    writer = istore.ImportanceWriter(path)
    existing = writer.settings()
    if existing and existing.get("key") != key:
        writer.close()
        raise ScanRefused(f"{Path(path).name} holds another run (another corpus, model or limits): choose a new "
                          "file, or delete it")
    if not existing:
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


def run_importance(corpus: Corpus, folder: str | Path, path: str | Path,
                   settings: ImportanceSettings = DEFAULT_SETTINGS, *, name: str | None = None,
                   dtype: str = "stored", loaded: tuple | None = None, source: str | None = None,
                   progress: Callable[[ImportanceProgress], None] | None = None,
                   should_stop: Callable[[], bool] | None = None,
                   measure: Callable | None = None) -> ImportanceProgress:
    """Measure every head of the checkpoint in ``folder`` over ``corpus`` into the database at ``path`` (created, or
    resumed where it stopped). ``loaded``: ``(model, tokenizer)`` already loaded (else loaded here); ``source``: the
    corpus as the command line names it (kept in the settings: a scan's documents link the run to the scan);
    ``measure``: runs the chunks (default: here, one after the other; :mod:`attnviz.corpus.importance.on_ray` passes
    Ray's). Returns the last progress (``status`` finished or stopped)."""
    model, tokenizer = loaded if loaded is not None else editable_checkpoint(folder, dtype)[:2]
    objective, planned, modules = prepare(model, tokenizer, corpus, settings)
    with open_run(path, corpus, folder, name or Path(folder).name, settings, objective, modules,
                  source, dtype) as writer:
        done = writer.done_documents()
        todo = [(doc, document) for doc, document in planned if doc not in done]
        state = ImportanceProgress(done=len(planned) - len(todo), planned=len(planned), started=time.time())
        writer.set(status=istore.STATUS_RUNNING)
        try:
            means = writer.means(modules)
            if means is None and "mean" in methods_for(objective, settings):
                state.phase = "means"
                report(progress, state)
                means = corpus_means(model, tokenizer, objective, planned, settings, should_stop)
                writer.write_means(modules, means)
            state.phase = "heads"
            report(progress, state)
            for rows, effects in (measure or measure_here)(model, tokenizer, objective, modules, todo, settings,
                                                           means, should_stop):
                writer.commit(rows, effects)
                state.done += len(rows)
                state.done_this_run += len(rows)
                state.tokens_this_run += int(rows["n_tokens"].sum())
                report(progress, state)
            state.status = istore.STATUS_FINISHED
        except Stopped:
            state.status = istore.STATUS_STOPPED
        writer.set(status=state.status, finished=time.time() if state.status == istore.STATUS_FINISHED else None)
    report(progress, state)
    return state


def measure_here(model, tokenizer, objective, modules, todo, settings, means, should_stop):
    """The chunks measured in this process, one after the other; stops before a chunk, or at a head (dropping it)."""
    for chunk in chunks(todo, settings.chunk_docs):
        if should_stop is not None and should_stop():
            raise Stopped
        yield measure_chunk(model, tokenizer, objective, modules, chunk, settings, means, should_stop)


def report(progress: Callable | None, state: ImportanceProgress) -> None:
    if progress is not None:
        progress(state)
