"""The scans of this browser (its folder of scans, kept like its models) and what the page reads from a scan's
database, cached by the file and its modification time so that a widget change reruns the page at once."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import streamlit as st

from attnviz.scan import background, store
from attnviz.scan.corpus import bundled_corpus, read_corpus
from attnviz.scan.runner import ScanSettings, scan_key
from attnviz.ui.session_models import browser_store
from attnviz.ui.session_uploads import session_uploads


def scan_folder() -> background.ScanFolder:
    """This browser's scans (beside its kept models, for the same hours), or this session's when the server keeps
    nothing (deleted with the session)."""
    store_ = browser_store()
    if store_ is not None:
        return background.ScanFolder(store_.folder / "scans")
    folder = st.session_state.get("scan_folder")
    if folder is None or not Path(folder).is_dir():
        folder = tempfile.mkdtemp(prefix="attnviz-scans-")
        session_uploads().folders.add(folder)
        st.session_state["scan_folder"] = folder
    return background.ScanFolder(folder)


def _stamp(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


@st.cache_data(max_entries=8, show_spinner=False)
def corpus_facts(path: str | None, stamp: float, split: str, field_name: str | None) -> dict:
    """A corpus's size, report and fingerprint (the bundled one for ``path`` None)."""
    corpus = bundled_corpus() if path is None else read_corpus(path, split=split, field_name=field_name)
    return {"documents": len(corpus.documents), "report": corpus.report.lines(), "fingerprint": corpus.fingerprint,
            "name": corpus.name, "first": corpus.documents[0].text[:300] if corpus.documents else ""}


@st.cache_data(max_entries=32, show_spinner=False)
def key_for(path: str | None, stamp: float, split: str, field_name: str | None, model_folder: str,
            settings: ScanSettings, dtype: str = "float32") -> str:
    """The key of the scan these settings name (``dtype``: the model's, as loaded)."""
    corpus = bundled_corpus() if path is None else read_corpus(path, split=split, field_name=field_name)
    return scan_key(corpus, model_folder, settings, dtype)


def scan_read(path: str | Path, method: str, *args, **kwargs):
    """``ScanReader(path).method(*args)``, cached by the file's modification time."""
    return _scan_read(str(path), _stamp(Path(path)), method, args, tuple(sorted(kwargs.items())))


@st.cache_data(max_entries=256, show_spinner=False)
def _scan_read(path: str, stamp: float, method: str, args: tuple, kwargs: tuple):
    with store.ScanReader(path) as reader:
        if method == "settings":
            return {**reader.settings, "documents_scanned": reader.documents}
        result = getattr(reader, method)(*args, **dict(kwargs))
    return tuple(np.asarray(part) for part in result) if method == "statistic_map" else result


def export_bytes(path: str | Path, table: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="attnviz-export-") as scratch:
        target = Path(scratch) / f"{table}.parquet"
        with store.ScanReader(path) as reader:
            reader.export_parquet(table, target)
        return target.read_bytes()
