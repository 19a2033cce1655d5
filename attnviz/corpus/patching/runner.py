"""Activation and path patching over a corpus: each document's own text typed twice, as the induction preset types
random tokens (:func:`attnviz.interventions.patching.induction_prompts`), patched site by site
(:func:`attnviz.interventions.activation_patching.patch_map`) and path by path
(:func:`attnviz.interventions.path_patching.path_patching`), a chunk of documents at a time, into DuckDB
(:mod:`attnviz.corpus.patching.store`), resumable, and on Ray when asked (:mod:`attnviz.corpus.patching.on_ray`)
with the same results.

One example per document (:func:`document_example`): its first ``period`` ordinary tokens are the first copy; the
clean prompt is [BOS, where the tokenizer has one] + first + first[:period // 2], whose answer is first[period // 2]
(what an induction head copies); the corrupted prompt changes the copied token (``change="copied"``; the foil is its
replacement) or the token before it (``"previous"``; the foil is the corrupted run's most likely other token) to an
ordinary token that is nowhere in the clean prompt, drawn from a generator seeded by the document's number and the
run's seed. Every example has the same length, so the maps of different documents line up cell for cell. A document
with fewer than ``period`` ordinary tokens is recorded with no cells and the reason.

The command line is :mod:`attnviz.corpus.patching`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnviz.core.circuits import ordinary_token_ids
from attnviz.corpus.documents import Corpus, CorpusRefused
from attnviz.corpus.options import as_json, option
from attnviz.corpus.patching import store as pstore
from attnviz.corpus.runner import (
    ChunkWork,
    Documents,
    Measure,
    Progress,
    Stopped,
    open_results,
    pending,
    report,
    run_chunks,
)
from attnviz.corpus.scan.runner import ScanRefused, model_fingerprint
from attnviz.interventions import activation_patching as ap
from attnviz.interventions import path_patching as pp
from attnviz.interventions.anatomy import Anatomy, anatomy

CHANGES = ("copied", "previous")
MLPS = tuple(pp.MLPS)  # "frozen", "free"
MOST_PERIOD = 256
MOST_CHUNK = 64
CHARACTERS_PER_TOKEN = 256  # a document is read up to period x this many characters: far more than its first tokens
RECEIVER = re.compile(r"^(\d+)\.(\d+):([qkv])$")


def parse_receiver(text: str) -> tuple[int, int, str]:
    """``"2.1:k"`` -> (layer 2, head 1, "k"): a path patching receiver and the input it is reached through."""
    found = RECEIVER.match(text.strip())
    if found is None:
        raise ScanRefused(f"a receiver is LAYER.HEAD:VIA with VIA one of q, k, v (e.g. 2.1:k), not {text[:40]!r}")
    return int(found.group(1)), int(found.group(2)), found.group(3)


def path_name(receiver: str, mlps: str) -> str:
    """A path map's name: ``"2.1:k/frozen"``."""
    layer, head, via = parse_receiver(receiver)
    return f"{layer}.{head}:{via}/{mlps}"


@dataclass(frozen=True)
class PatchingSettings:
    """What a corpus patching run reads and measures; its fields are also the JSON a background run is given and the
    options of ``python -m attnviz.corpus.patching`` (:mod:`attnviz.corpus.options`)."""

    max_docs: int = field(default=200, metadata=option("the corpus's first documents read"))
    period: int = field(default=16, metadata=option(
        "each document's first ordinary tokens typed, then their first half again (the prompt); a document with "
        "fewer is left out"))
    change: str = field(default="copied", metadata=option(
        "what the corrupted prompt changes: the copied token (the foil: its replacement) or the one before it",
        choices=CHANGES))
    seed: int = field(default=0, metadata=option("the replacement tokens' seed (with each document's number)"))
    sites: tuple[str, ...] = field(default=("resid", "head"), metadata=option(
        f"comma-separated activation patching sites: {', '.join(ap.SITES)}; none: paths only",
        metavar="SITE,..."))
    by_position: bool = field(default=False, metadata=option("head sites: a cell per head and position"))
    direction: str = field(default="denoising", metadata=option(
        "denoising: the clean run's activation into the corrupted run; noising: the other way",
        choices=tuple(ap.DIRECTIONS)))
    metric: str = field(default="logit difference", metadata=option(
        "what is measured at the last position", choices=tuple(ap.METRICS)))
    receivers: tuple[str, ...] = field(default=(), metadata=option(
        "path patching: comma-separated receivers LAYER.HEAD:VIA (VIA q, k or v), e.g. 2.1:k,2.1:v",
        metavar="L.H:VIA,...", default_words="none"))
    mlps: tuple[str, ...] = field(default=("frozen",), metadata=option(
        "path patching: comma-separated, the MLPs between sender and receiver: frozen (the direct path), free "
        "(and every path through them)", metavar="frozen,free"))
    chunk_docs: int = field(default=8, metadata=option(
        "documents per committed chunk (and Ray batch): what a stop may lose", flag="--chunk"))

    def __post_init__(self):
        if self.max_docs < 1 or not 1 <= self.chunk_docs <= MOST_CHUNK:
            raise ScanRefused(f"a run reads at least 1 document, in chunks of 1 to {MOST_CHUNK} documents")
        if not 4 <= self.period <= MOST_PERIOD:
            raise ScanRefused(f"the period is 4 to {MOST_PERIOD} tokens, not {self.period}")
        if self.change not in CHANGES:
            raise ScanRefused(f"change is one of {', '.join(CHANGES)}, not {self.change!r}")
        if self.seed < 0:
            raise ScanRefused("the seed is a whole number, 0 or more")
        unknown = [site for site in self.sites if site not in ap.SITES]
        if unknown or len(set(self.sites)) != len(self.sites):
            raise ScanRefused(f"sites are {', '.join(ap.SITES)}, each once, not {', '.join(unknown) or 'repeated'}")
        if self.direction not in ap.DIRECTIONS or self.metric not in ap.METRICS:
            raise ScanRefused(f"direction is one of {', '.join(ap.DIRECTIONS)}; metric one of "
                              f"{', '.join(ap.METRICS)}")
        for receiver in self.receivers:
            parse_receiver(receiver)
        if len({path_name(receiver, "") for receiver in self.receivers}) != len(self.receivers):
            raise ScanRefused("each receiver once")
        if not self.mlps or any(mlps not in MLPS for mlps in self.mlps) or len(set(self.mlps)) != len(self.mlps):
            raise ScanRefused(f"mlps are {', '.join(MLPS)}, each once")
        if not self.sites and not self.receivers:
            raise ScanRefused("nothing to measure: give sites, receivers or both")

    @property
    def paths(self) -> list[tuple[str, tuple[int, int], str, str]]:
        """Every path map: (name, receiver, via, mlps)."""
        found = []
        for receiver in self.receivers:
            layer, head, via = parse_receiver(receiver)
            found += [(path_name(receiver, mlps), (layer, head), via, mlps) for mlps in self.mlps]
        return found


DEFAULT_SETTINGS = PatchingSettings()


@dataclass
class PatchingProgress(Progress):
    skipped: int = 0  # documents left out (fewer ordinary tokens than the period), this run and before


# -- the examples ---------------------------------------------------------------------------------------------------
def prompt_length(period: int, bos: int | None) -> int:
    """Every example's length in tokens."""
    return (bos is not None) + period + period // 2


def changed_position(period: int, bos: int | None, change: str) -> int:
    """The position the corrupted prompt changes: the copied token's first occurrence, or the token before it."""
    return (bos is not None) + period // 2 - (change == "previous")


def document_seed(seed: int, doc: int) -> int:
    """The seed of document ``doc``'s replacement token: the run's seed and the document's number, mixed."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{doc}".encode()).digest()[:8], "big") & (2**63 - 1)


def ordinary_tokens(tokenizer, text: str, period: int) -> list[int]:
    """The first ``period`` ordinary tokens of ``text`` (as the tokenizer reads it without adding special tokens,
    any special token in it left out)."""
    special = set(tokenizer.all_special_ids)
    ids = tokenizer(text[: period * CHARACTERS_PER_TOKEN], add_special_tokens=False)["input_ids"]
    return [token for token in ids if token not in special][:period]


def document_example(tokens: list[int], period: int, *, doc: int, seed: int, vocabulary: list[int],
                     bos: int | None, change: str) -> ap.Example | str:
    """A document's example from its ordinary ``tokens`` (its first ``period`` of them typed, then their first half
    again, after ``bos``), the corrupted prompt changing the copied token or the one before it (``change``) to a token
    of ``vocabulary`` absent from the clean prompt, drawn by a generator seeded with ``seed`` and ``doc``; or why
    there is none (fewer tokens than the period). Pure: the same arguments give the same example."""
    if change not in CHANGES:
        raise ValueError(f"change: one of {', '.join(CHANGES)}")
    if len(tokens) < period:
        return f"{len(tokens)} ordinary tokens, fewer than the period ({period})"
    first, stop = list(tokens[:period]), period // 2
    clean = ([] if bos is None else [bos]) + first + first[:stop]
    present = set(clean)
    others = [token for token in vocabulary if token not in present]
    if not others:
        return "every ordinary token is in its prompt: none is left to put in"
    generator = torch.Generator().manual_seed(document_seed(seed, doc))
    replacement = others[int(torch.randint(len(others), (1,), generator=generator))]
    corrupted = list(clean)
    corrupted[changed_position(period, bos, change)] = replacement
    return ap.Example(clean, corrupted, first[stop], replacement if change == "copied" else None)


# -- the maps -------------------------------------------------------------------------------------------------------
def axes_of(kind: str, site: str, by_position: bool) -> tuple[str, ...]:
    """Which of row, head, position index a map's grid (after its documents)."""
    if kind == "path":
        return ("row", "head")
    if site in ap.HEAD_SITES:
        return ("row", "head", "position") if by_position else ("row", "head")
    return ("row", "position")


def maps_of(model: torch.nn.Module, parts: Anatomy, settings: PatchingSettings, n: int) -> pd.DataFrame:
    """The maps a run makes, with their axes, grid and row labels (the ``maps`` table)."""
    labels = [layer.attention.label for layer in parts.layers]
    rows = []
    for site in settings.sites:
        by_position = settings.by_position and site in ap.HEAD_SITES
        _, grid = ap.cells_of(site, model, parts, n, by_position)
        rows.append(("map", site, list(axes_of("map", site, by_position)), list(grid),
                     ap.residual_rows(len(parts.layers)) if site == "resid" else labels))
    for name, (layer, _), _, _ in settings.paths:
        heads = [part.attention.heads for part in parts.layers[:layer]]
        rows.append(("path", name, ["row", "head"], [layer, max(heads)], labels[:layer]))
    return pd.DataFrame([(number, *row) for number, row in enumerate(rows)],
                        columns=["number", "kind", "name", "axes", "grid", "rows"])


def check_positions(model: torch.nn.Module, settings: PatchingSettings, n: int) -> None:
    """Refuse a prompt longer than the model's positions."""
    config = getattr(model, "config", None)
    most = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    if isinstance(most, int) and n > most:
        raise ScanRefused(f"a prompt of period {settings.period} is {n} tokens: more than this model's {most} "
                          "positions")


def check_model(model: torch.nn.Module, parts: Anatomy, settings: PatchingSettings, n: int) -> None:
    """Refuse, before anything is written, what this model cannot measure: a receiver it does not have, MLPs it has
    not (where a site or a held path needs them)."""
    layers = len(parts.layers)
    for receiver in settings.receivers:
        layer, head, _ = parse_receiver(receiver)
        if not 0 < layer < layers or head >= parts.layers[layer].attention.heads:
            raise ScanRefused(f"receiver {receiver}: a head of layer 1 to {layers - 1} (a head of layer 0 has no "
                              "sender before it)")
    no_mlp = any(part.mlp is None for part in parts.layers)
    if no_mlp and ({"attn", "mlp"} & set(settings.sites) or (settings.receivers and "frozen" in settings.mlps)):
        raise ScanRefused("this model's MLPs were not found: leave out the sites attn and mlp and frozen MLPs")


def _cells(kind: str, name: str, axes: tuple[str, ...], values: torch.Tensor, shares: torch.Tensor,
           docs: list[int]) -> pd.DataFrame:
    """A map's ``[documents, *grid]`` values and shares as rows of the ``cells`` table (cells without a value, of a
    layer with fewer heads, left out)."""
    values_np, shares_np = values.numpy(), shares.numpy()
    index = np.indices(values_np.shape).reshape(values_np.ndim, -1)  # [1 + axes, cells]
    flat_values, flat_shares = values_np.reshape(-1), shares_np.reshape(-1)
    keep = ~np.isnan(flat_values)
    by_axis = dict(zip(axes, index[1:], strict=True))
    count = int(keep.sum())
    return pd.DataFrame({
        "doc": np.asarray(docs, dtype=np.int64)[index[0][keep]],
        "kind": [kind] * count, "name": [name] * count,
        "row": by_axis["row"][keep].astype(np.int16),
        "head": by_axis["head"][keep].astype(np.int16) if "head" in by_axis else np.full(count, -1, np.int16),
        "position": by_axis["position"][keep].astype(np.int32) if "position" in by_axis
        else np.full(count, -1, np.int32),
        "value": flat_values[keep], "share": flat_shares[keep]}, columns=pstore.CELL_COLUMNS)


def measure_chunk(model: torch.nn.Module, tokenizer, parts: Anatomy, documents: Documents,
                  settings: PatchingSettings, vocabulary: list[int],
                  should_stop: Callable[[], bool] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One chunk's rows: ``documents`` (every document of the chunk; those left out with their reason) and
    ``cells`` (each measured document's every map cell). ``should_stop`` is asked after every batched forward:
    :class:`Stopped` drops the chunk."""
    def check(_share=0.0, _words=""):
        if should_stop is not None and should_stop():
            raise Stopped

    bos = tokenizer.bos_token_id
    facts: dict[int, dict] = {}
    made: list[tuple[int, ap.Example]] = []
    for doc, document in documents:
        tokens = ordinary_tokens(tokenizer, document.text, settings.period)
        example = document_example(tokens, settings.period, doc=doc, seed=settings.seed, vocabulary=vocabulary,
                                   bos=bos, change=settings.change)
        facts[doc] = {"n_tokens": len(tokens)}
        if isinstance(example, str):
            facts[doc]["skipped"] = example
        else:
            made.append((doc, example))
            facts[doc].update(answer=example.answer, replacement=example.corrupted[changed_position(
                settings.period, bos, settings.change)])
    cells = []
    if made:
        check()
        docs, examples = [doc for doc, _ in made], [example for _, example in made]
        ends = None
        for site in settings.sites:
            found = ap.patch_map(model, examples, site, direction=settings.direction, metric=settings.metric,
                                 by_position=settings.by_position, parts=parts, progress=check)
            cells.append(_cells("map", site, axes_of("map", site, found.by_position), found.values, found.shares,
                                docs))
            ends = ends or (found.clean, found.corrupted, found.foils)
        for name, receiver, via, mlps in settings.paths:
            found = pp.path_patching(model, examples, receiver, via, mlps=mlps, direction=settings.direction,
                                     metric=settings.metric, parts=parts, progress=check)
            cells.append(_cells("path", name, axes_of("path", name, False), found.values, found.shares, docs))
            ends = ends or (found.clean, found.corrupted, found.foils)
        clean, corrupted, foils = ends
        for at, doc in enumerate(docs):
            facts[doc].update(clean=float(clean[at]), corrupted=float(corrupted[at]), foil=int(foils[at]))
    rows = pd.DataFrame([(doc, document.source, document.text, facts[doc]["n_tokens"], facts[doc].get("clean"),
                          facts[doc].get("corrupted"), facts[doc].get("answer"), facts[doc].get("foil"),
                          facts[doc].get("replacement"), facts[doc].get("skipped"))
                         for doc, document in documents], columns=pstore.DOCUMENT_COLUMNS)
    for column in ("answer", "foil", "replacement"):
        rows[column] = rows[column].astype("Int64")
    for column in ("clean", "corrupted"):
        rows[column] = rows[column].astype("float64")
    found_cells = pd.concat(cells, ignore_index=True) if cells else pd.DataFrame(columns=pstore.CELL_COLUMNS)
    return rows, found_cells


# -- the run --------------------------------------------------------------------------------------------------------
def patching_key(corpus: Corpus | str, folder: str | Path, settings: PatchingSettings, dtype: str = "stored") -> str:
    """The same corpus, model, dtype and settings (but the chunk size) give the same key: the same run, resumed."""
    fingerprint = corpus if isinstance(corpus, str) else corpus.fingerprint
    chosen = {name: sorted(value) if isinstance(value, list) and name in ("sites", "receivers", "mlps") else value
              for name, value in as_json(settings).items() if name != "chunk_docs"}
    wanted = {"corpus": fingerprint, "model": model_fingerprint(folder), **chosen, "schema": pstore.SCHEMA_VERSION,
              **({} if dtype == "stored" else {"dtype": dtype})}
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:24]


def load_model(folder: str | Path, dtype: str = "stored") -> tuple[torch.nn.Module, object]:
    """The folder's causal LM and tokenizer, its attention switched to attnviz's (where patches act); in float32
    for ``dtype="fp32"``."""
    from attnviz.interventions.edits import editable_lm

    if dtype not in ("stored", "fp32"):
        raise ScanRefused(f"dtype is stored or fp32, not {dtype!r}")
    model, tokenizer = editable_lm(folder)
    if dtype == "fp32":
        model = model.float()
    return model.eval(), tokenizer


def prepare(model: torch.nn.Module, tokenizer, settings: PatchingSettings) -> tuple[list[int], Anatomy, int]:
    """What every chunk needs, in this process or a replica: the ordinary tokens to draw from, the model's parts (as
    found on a prompt of the run's length) and that length; refused when the model cannot measure the settings."""
    vocabulary = ordinary_token_ids(tokenizer)
    n = prompt_length(settings.period, tokenizer.bos_token_id)
    if len(vocabulary) < 2 * n:
        raise ScanRefused(f"the tokenizer has {len(vocabulary)} ordinary tokens: too few for prompts of {n}")
    check_positions(model, settings, n)
    parts = anatomy(model, {"input_ids": torch.tensor([vocabulary[:n]])})
    check_model(model, parts, settings, n)
    return vocabulary, parts, n


def patching_replica(folder: str, dtype: str, settings: PatchingSettings) -> Callable[[Documents], tuple]:
    """:func:`measure_chunk` in another process (a Ray actor), with its own replica of the checkpoint in ``folder``."""
    model, tokenizer = load_model(folder, dtype)
    vocabulary, parts, _ = prepare(model, tokenizer, settings)
    return lambda documents: measure_chunk(model, tokenizer, parts, documents, settings, vocabulary)


def open_run(path: str | Path, corpus: Corpus, folder: str | Path, name: str, settings: PatchingSettings,
             maps: pd.DataFrame, n: int, source: str | None = None, dtype: str = "stored") -> pstore.PatchingWriter:
    """The run's database: new (its settings and maps written), or the same run's to resume; refused if it holds
    another."""
    key = patching_key(corpus, folder, settings, dtype)
    writer, new = open_results(pstore.PatchingWriter, path, key, "run", ScanRefused)
    if new:
        writer.set(key=key, model=name, model_folder=str(folder), source=source, corpus=corpus.name,
                   corpus_fingerprint=corpus.fingerprint, corpus_documents=corpus.count, dtype=dtype,
                   **as_json(settings), prompt_tokens=n, planned=min(settings.max_docs, corpus.count),
                   versions=pstore.versions(), started=time.time(), status=pstore.STATUS_RUNNING)
    writer.write_maps(maps)
    return writer


def run_patching(corpus: Corpus, folder: str | Path, path: str | Path,
                 settings: PatchingSettings = DEFAULT_SETTINGS, *, name: str | None = None, dtype: str = "stored",
                 loaded: tuple | None = None, source: str | None = None,
                 progress: Callable[[PatchingProgress], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, measure: Measure | None = None) -> PatchingProgress:
    """Patch the checkpoint in ``folder`` over ``corpus`` into the database at ``path`` (created, or resumed from its
    last committed chunk). ``loaded``: ``(model, tokenizer)`` already loaded, with attnviz's attention (else loaded
    here); ``source``: the corpus as the command line names it; ``measure``: where the chunks are measured (default:
    here, a stop asked after every batched forward; :func:`attnviz.corpus.on_ray.on_ray`: on Ray). Returns the last
    progress (``status`` finished or stopped)."""
    model, tokenizer = loaded if loaded is not None else load_model(folder, dtype)
    planned = list(enumerate(corpus.documents[: settings.max_docs]))
    if not planned:
        raise CorpusRefused("the corpus holds no document to measure")
    vocabulary, parts, n = prepare(model, tokenizer, settings)
    with open_run(path, corpus, folder, name or Path(folder).name, settings, maps_of(model, parts, settings, n), n,
                  source, dtype) as writer:
        todo = pending(planned, writer.done_documents())
        skipped = writer.connection.execute("SELECT count(*) FROM documents WHERE skipped IS NOT NULL").fetchone()[0]
        state = PatchingProgress(done=len(planned) - len(todo), planned=len(planned), started=time.time(),
                                 skipped=int(skipped), finished_before=not todo)
        writer.set(status=pstore.STATUS_RUNNING)
        report(progress, state)
        try:
            work = ChunkWork(
                here=lambda chunk: measure_chunk(model, tokenizer, parts, chunk, settings, vocabulary, should_stop),
                replica=functools.partial(patching_replica, str(folder), dtype, settings),
                chunk_docs=settings.chunk_docs)
            run_chunks(work, todo, lambda _chunk, measured: record_rows(writer, state, *measured), state,
                       measure=measure, progress=progress, should_stop=should_stop)
            state.status = pstore.STATUS_FINISHED
        except Stopped:
            state.status = pstore.STATUS_STOPPED
        writer.set(status=state.status, finished=time.time() if state.status == pstore.STATUS_FINISHED else None)
    report(progress, state)
    return state


def record_rows(writer: pstore.PatchingWriter, state: PatchingProgress, rows: pd.DataFrame,
                cells: pd.DataFrame) -> None:
    """One chunk's documents and cells committed; counted in ``state``."""
    writer.commit(rows, cells)
    state.done += len(rows)
    state.done_this_run += len(rows)
    state.skipped += int(rows["skipped"].notna().sum())
    state.tokens_this_run += int(rows["n_tokens"].sum())
