"""The "Does this head matter?" page's models and results, kept process-wide by their inputs.

Maps and patching report progress to the page while they run, so they are not ``st.cache_resource`` functions
(Streamlit would replay the progress bar's updates on a cache hit): their results go in small stores of their own,
bounded and shared by every session, keyed by everything they depend on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import streamlit as st

from attnviz.corpus import background
from attnviz.corpus.documents import bundled_corpus
from attnviz.corpus.importance.runner import (
    SCAN_PREFIX,
    ImportanceSettings,
    importance_key,
    read_corpus_spec,
    scan_corpus_facts,
)
from attnviz.corpus.importance.store import ImportanceReader
from attnviz.corpus.scan.store import ScanReader
from attnviz.interventions import importance as imp
from attnviz.interventions import induction_circuit as ind
from attnviz.interventions.edits import editable_checkpoint, editable_lm
from attnviz.interventions.mlp_ablation import mlp_ablation
from attnviz.ui.caches.store import BoundedStore, file_stamp
from attnviz.ui.loaded_models import load_bundle
from attnviz.ui.scans import scan_folder

WITH_LOSS = ("decoder", "encoder-decoder")  # architectures whose checkpoints load with a loss


@st.cache_resource(max_entries=2, show_spinner="Loading the model with its language-model head (first time only)…")
def _editable_lm(folder: str, name: str, masked: bool = False):
    return editable_lm(folder, masked)


def editable_model(folder: str, name: str, dtype: str = "stored") -> tuple[object, object, str]:
    """``(model, tokenizer, note)`` as :func:`~attnviz.interventions.edits.editable_checkpoint` gives them, the
    models with a head cached here (their own copies, with attnviz's attention function), an encoder without one
    the session's loaded model itself."""
    return editable_checkpoint(folder, dtype, load_lm=lambda path, masked: _editable_lm(path, name, masked),
                               load_encoder=lambda path: load_bundle(path, name, dtype))


@st.cache_resource(show_spinner=False)
def _stores() -> dict[str, BoundedStore]:
    return {"study": BoundedStore(8), "partial": BoundedStore(8)}


def study(key: tuple, model, tokenizer, texts: list[str], progress: Callable | None = None,
          compute: bool = True) -> imp.Study | None:
    """The maps of ``texts`` (``key``: the model and the texts), computed once (None if not yet and not
    ``compute``)."""
    store, partial = _stores()["study"], _stores()["partial"]
    found = store.get(key)
    if found is None and compute:
        finished = partial.get(key)
        if finished is None:
            finished = {}
            partial.put(key, finished)  # filled head by head: a run stopped part way goes on from there
        found = imp.study(model, tokenizer, texts, progress=progress, finished=finished)
        store.put(key, found)
        partial.drop(key)
    return found


def heads_measured(key: tuple) -> int:
    """How many head ablations a stopped run of ``key`` has kept (0: none, or it finished)."""
    finished = _stores()["partial"].get(key)
    return sum(len(done) for done in finished.values()) if finished else 0


@st.cache_resource(max_entries=8, show_spinner="Removing each layer's MLP…")
def cached_mlp_ablation(key: tuple, how: str, _model, _study: imp.Study):
    """Each layer's MLP ablated on the study's texts (``key`` names the study), or why not, in words."""
    try:
        return mlp_ablation(_model, _study.batch, how, objective=_study.objective)
    except (ValueError, RuntimeError) as problem:
        return str(problem)


@st.cache_resource(max_entries=32, show_spinner=False)
def cached_token_effect(key: tuple, row: int, head: int, how: str, text: int, _model, _study: imp.Study):
    """One head's effect on each token of one text: the study's clean run is kept (``key`` names the study), so a
    change of head or text runs only that text again, with the head ablated."""
    return imp.token_effect(_model, _study.batch, _study.modules[row], head, how, text, objective=_study.objective,
                            clean=cached_clean_run(key, _model, _study))


@st.cache_resource(max_entries=4, show_spinner=False)
def cached_clean_run(key: tuple, _model, _study: imp.Study) -> tuple:
    return imp.clean_run(_model, _study.batch, _study.objective)


@st.cache_resource(max_entries=4, show_spinner="Removing each head in turn…")
def cached_circuit(folder: str, name: str, period: int, seed: int, bos: int | None, _model, _tokens: list[int]):
    """The circuit's ablations, every head's scores, and the induction scores with the previous-token head that may
    feed the induction heads zeroed (None without one)."""
    result = ind.induction_circuit(_model, _tokens, period=period, seed=seed, bos=bos)
    scores = ind.circuit_scores(_model, _tokens, period=period, seed=seed, bos=bos)
    return result, scores, ind.without_feeder(_model, _tokens, result, scores, period=period, seed=seed, bos=bos)


# The page's form: what it keeps when a view that does not draw it is shown (Streamlit forgets the value of a widget
# a run does not draw, so switching views and back would reset it)
FORM_KEYS = ("imp_source", "imp_texts", "imp_documents", "imp_corpus", "imp_corpus_docs", "imp_corpus_tokens",
             "imp_corpus_methods", "imp_how", "imp_circuit_period", "imp_circuit_seed")


def keep_form(keys: tuple[str, ...] = FORM_KEYS) -> None:
    """Write each of the form's values back into the session state, before any widget is drawn: a value written by
    the script is kept whether or not its widget is drawn this run."""
    for key in keys:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


@st.cache_resource(show_spinner=False)
def corpus_texts(count: int) -> list[str]:
    """The first ``count`` documents of the bundled corpus, each on one line."""
    return [" ".join(document.text.split()) for document in bundled_corpus().documents[:count]]


# -- corpus runs (background jobs) ----------------------------------------------------------------------------------
BUNDLED_SPEC = "bundled"


def importance_jobs() -> background.ScanFolder:
    """This browser's corpus importance runs: a folder beside its scans (one job at a time)."""
    scans = scan_folder()
    return background.ScanFolder(scans.folder / "importance", owner=scans.owner)


def run_facts(spec: str, model_folder: str, settings: ImportanceSettings, dtype: str = "stored") -> dict:
    """The run's key and how many documents it reads, for a corpus ``spec`` (``bundled`` or ``scan:FILE``) and the
    model's dtype ("stored" or "fp32")."""
    stamp = 0.0 if spec == BUNDLED_SPEC else file_stamp(Path(spec.removeprefix(SCAN_PREFIX)))
    return _run_facts(spec, stamp, model_folder, settings, dtype)


@st.cache_data(max_entries=16, show_spinner="Reading the corpus…")
def _run_facts(spec: str, stamp: float, model_folder: str, settings: ImportanceSettings, dtype: str) -> dict:
    corpus = (scan_corpus_facts(spec.removeprefix(SCAN_PREFIX)) if spec.startswith(SCAN_PREFIX)
              else read_corpus_spec(spec))  # a scan's texts stay in its file: only their hashes are read
    return {"key": importance_key(corpus, model_folder, settings, dtype), "documents": corpus.count,
            "name": "the bundled corpus" if spec == BUNDLED_SPEC else corpus.name,
            "characters": corpus.characters_of_first(settings.max_docs)}


def run_results(path: Path) -> dict | None:
    """What a run's database holds (None if it cannot be read now), cached by the file's modification time."""
    if not path.is_file():
        return None
    try:
        return _run_results(str(path), file_stamp(path))
    except Exception:  # noqa: BLE001 - a file being written, cut short, or not a run: nothing to show
        return None


@st.cache_data(max_entries=16, show_spinner=False)
def _run_results(path: str, stamp: float) -> dict:
    with ImportanceReader(path) as reader:
        return {"settings": reader.settings, "modules": reader.modules(), "maps": reader.maps(),
                "clean": reader.clean(), "documents": reader.documents}


@st.cache_data(max_entries=64, show_spinner=False)
def run_documents(path: str, stamp: float, method: str, module: int, head: int) -> list[dict]:
    with ImportanceReader(path) as reader:
        return reader.per_document(method, module, head).to_dict("records")


def scan_top_labels(path: Path) -> tuple[str, dict] | None:
    """A scan's model folder and each head's most frequent label (None if it cannot be read now)."""
    if not path.is_file():
        return None
    try:
        return _scan_top_labels(str(path), file_stamp(path))
    except Exception:  # noqa: BLE001 - a scan being written, or not a scan
        return None


@st.cache_data(max_entries=8, show_spinner=False)
def _scan_top_labels(path: str, stamp: float) -> tuple[str, dict]:
    with ScanReader(path) as reader:
        return str(reader.settings.get("model_folder", "")), reader.top_labels()
