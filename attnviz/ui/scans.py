"""The scans of this browser (its folder of scans, kept like its models) and what the page reads from a scan's
database, cached by the file and its modification time so that a widget change reruns the page at once."""

from __future__ import annotations

import functools
import inspect
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

import streamlit as st

from attnviz.checkpoints import disk
from attnviz.core.units import ordinal
from attnviz.corpus import background, database
from attnviz.corpus.document_probe import facts_of, probe
from attnviz.corpus.documents import CorpusRefused
from attnviz.corpus.scan import store
from attnviz.corpus.scan.runner import ScanSettings, scan_key
from attnviz.ui.caches.store import file_stamp
from attnviz.ui.session_models import browser_store
from attnviz.ui.session_uploads import session_uploads

P = ParamSpec("P")
R = TypeVar("R")


def scan_folder() -> background.ScanFolder:
    """This browser's scans (beside its kept models, for the same hours), or this session's when the server keeps
    nothing (inside the uploads' folder, so that its bytes count; deleted with the session)."""
    store_ = browser_store()
    if store_ is not None:
        return background.ScanFolder(store_.folder / "scans")
    folder = st.session_state.get("scan_folder")
    if folder is None or not Path(folder).is_dir():
        folder = tempfile.mkdtemp(prefix="attnviz-scans-", dir=disk.uploads_root())
        session_uploads().folders.add(folder)
        st.session_state["scan_folder"] = folder
    return background.ScanFolder(folder)


def session_id() -> str:
    """This Streamlit session's own random id (kept in its session state): a job is limited per session as well as
    per browser."""
    if "session_id" not in st.session_state:
        st.session_state["session_id"] = secrets.token_hex(16)
    return st.session_state["session_id"]


def corpus_facts(path: str | None, stamp: float, split: str, field_name: str | None) -> dict:
    """A corpus's size, report, fingerprint and first document (the bundled one for ``path`` None), read once per
    file and reading (a file in a child process with a memory and CPU cap: :func:`probe`). Refused in words
    (:class:`CorpusRefused`); a refusal is remembered too, so a rerun does not read the file again."""
    facts = _corpus_facts(path, stamp, split, field_name)
    if "refused" in facts:
        raise CorpusRefused(facts["refused"])
    return facts


@st.cache_data(max_entries=8, show_spinner="Reading the corpus…")
def _corpus_facts(path: str | None, stamp: float, split: str, field_name: str | None) -> dict:
    try:
        return facts_of(None) if path is None else probe(path, "facts", split=split, field_name=field_name)
    except CorpusRefused as problem:
        return {"refused": str(problem)}


def corpus_columns(path: str, stamp: float) -> list[str]:
    """The fields or columns a corpus file offers for its text, read in the child process; refused in words."""
    found = _corpus_columns(path, stamp)
    if isinstance(found, dict):
        raise CorpusRefused(found["refused"])
    return found


@st.cache_data(max_entries=8, show_spinner=False)
def _corpus_columns(path: str, stamp: float) -> list[str] | dict:
    try:
        return probe(path, "columns")
    except CorpusRefused as problem:
        return {"refused": str(problem)}


@st.cache_data(max_entries=32, show_spinner=False)
def key_for(fingerprint: str, model_folder: str, settings: ScanSettings, dtype: str = "float32") -> str:
    """The key of the scan these settings name (``fingerprint``: the corpus's, from :func:`corpus_facts`, so
    that a change of limits never reads the corpus again; ``dtype``: the model's, as loaded)."""
    return scan_key(fingerprint, model_folder, settings, dtype)


def _reading(method: Callable[Concatenate[store.ScanReader, P], R]) -> Callable[Concatenate[str | Path, P], R]:
    """``method`` of a :class:`~attnviz.corpus.scan.store.ScanReader` as a function of the scan's path:
    ``reading(path, *args)`` is ``ScanReader(path).method(*args)``, cached by the path, the file's modification time
    and the arguments (each reading its own cache). A file being written raises
    :class:`attnviz.corpus.database.DatabaseBusy`; one that is not a scan (or holds more than a scan's schema)
    :class:`attnviz.corpus.database.NotAResultsFile`."""

    def read_file(path: str, stamp: float, args: tuple, kwargs: tuple):
        with store.ScanReader(path) as reader:
            return method(reader, *args, **dict(kwargs))

    # Streamlit names a cache by its function's module, qualified name and source: one name per reading, or the
    # readings (one nested function each) would share their entries
    read_file.__name__ = method.__name__
    read_file.__qualname__ = f"scan_reading.{method.__name__}"
    cached = st.cache_data(max_entries=256, show_spinner=False)(read_file)

    @functools.wraps(method)
    def reading(path: str | Path, *args: P.args, **kwargs: P.kwargs) -> R:
        return cached(str(path), file_stamp(path), args, tuple(sorted(kwargs.items())))

    said = inspect.signature(method)  # the method's, with the scan's path for its reader
    reader, *rest = said.parameters.values()
    reading.__signature__ = said.replace(parameters=[reader.replace(name="path", annotation="str | Path"), *rest])
    return reading


def _settings(reader: store.ScanReader) -> dict:
    """A scan's settings, with how many documents it holds (``documents_scanned``)."""
    return {**reader.settings, "documents_scanned": reader.documents}


# What the pages read from a scan's database: one cached function per reading
scan_settings = _reading(_settings)
statistics_that_apply = _reading(store.ScanReader.statistics_that_apply)
statistic_map = _reading(store.ScanReader.statistic_map)
offsets_map = _reading(store.ScanReader.offsets_map)
is_causal = _reading(store.ScanReader.is_causal)
label_shares = _reading(store.ScanReader.label_shares)
head_summary = _reading(store.ScanReader.head_summary)
offset_profile = _reading(store.ScanReader.offset_profile)
histogram = _reading(store.ScanReader.histogram)
token_pairs = _reading(store.ScanReader.token_pairs)
key_tokens = _reading(store.ScanReader.key_tokens)
criteria_with_examples = _reading(store.ScanReader.criteria_with_examples)
examples = _reading(store.ScanReader.examples)
document = _reading(store.ScanReader.document)
search_queries = _reading(store.ScanReader.search_queries)
query_contexts = _reading(store.ScanReader.query_contexts)
search_heads = _reading(store.ScanReader.search_heads)


def results_kind(path: str | Path) -> str:
    """What a ``.duckdb`` file of a scan folder holds: "scan" (a scan's database), "importance" (a corpus importance
    run's), "busy" (being written now: not known yet) or "other" (neither, or damaged); cached by the file's
    modification time."""
    return _results_kind(str(path), file_stamp(path))


@st.cache_data(max_entries=256, show_spinner=False)
def _results_kind(path: str, stamp: float) -> str:
    from attnviz.corpus.importance.store import ImportanceReader

    for kind, reader in (("scan", store.ScanReader), ("importance", ImportanceReader)):
        try:
            with reader(path):
                return kind
        except database.NotAResultsFile:
            continue
        except (database.DatabaseBusy, MemoryError, OSError):
            return "busy"
        except Exception:  # noqa: BLE001 - any other reading problem: not listed as either
            return "other"
    return "other"


def listed_scans(folder: background.ScanFolder | None = None) -> list[Path]:
    """The scans to offer: this browser's (``folder``, default :func:`scan_folder`) and the server's
    (``ATTNVIZ_SCAN_ROOT``), newest first, leaving out every file that is not a scan (a corpus importance run put
    beside the scans, a damaged file); a file being written is listed (it says so when opened)."""
    folder = folder if folder is not None else scan_folder()
    return [path for path in [*folder.scans(), *background.server_scans()]
            if results_kind(path) in ("scan", "busy")]


def readable_scans(folder: background.ScanFolder) -> list[Path]:
    """The scans the corpus page offers to read: this browser's (``folder``) and the server's, but the one being
    written now; a corpus importance run kept beside the scans is not one, a foreign or damaged file is listed (to
    say so)."""
    job = folder.job()
    running = None if job is None else folder.database(job.key)
    return [path for path in [*folder.scans(), *background.server_scans()]
            if path != running and results_kind(path) != "importance"]


def scan_named(path: str | Path, describe) -> str:
    """A scan file as a page lists it: ``describe(settings)`` (its settings with ``documents_scanned``), or its file
    name with why it cannot be: not a scan, or being written now."""
    try:
        said = scan_settings(path)
    except database.NotAResultsFile:
        return f"{Path(path).name} (not a scan)"
    except Exception:  # noqa: BLE001 - a file being written
        return f"{Path(path).name} (cannot be read now)"
    status = said.get("status")
    return describe(said) + ("" if status == store.STATUS_FINISHED else f" · {status}")


def scan_title(path: str | Path) -> str:
    """A scan as the pages name it: its corpus, model, how many documents it read and when it started."""

    def describe(said: dict) -> str:
        started = said.get("started")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(started))) if started else "date unknown"
        return (f"{said.get('corpus')} · {said.get('model')} · {int(said.get('documents_scanned', 0)):,} documents · "
                f"{when}")

    return scan_named(path, describe)


def existing_scan(folder: background.ScanFolder, path: Path) -> dict | str | None:
    """The settings of the scan file some settings name, in this browser's ``folder``: None when there is none (a
    file that is not a scan at all, or damaged, is deleted: only this case), "busy" when it cannot be read now (said
    in the page; the files are left alone)."""
    from attnviz.ui.messages import problem_text

    try:
        return scan_settings(path)
    except database.NotAResultsFile as problem:
        if problem.missing:
            folder.delete(path.stem)
            return None
        st.error(f"This browser's scan file for these settings cannot be read: {problem}.", icon=":material/error:")
    except (database.DatabaseBusy, MemoryError, OSError) as problem:
        st.warning(f"The scan for these settings is busy ({problem_text(problem)}): try again in a moment.",
                   icon=":material/hourglass_top:")
    except Exception as problem:  # noqa: BLE001 - anything else: said, and the files are left alone
        st.error(f"This browser's scan file for these settings cannot be read now: "
                 f"{database.without_paths(problem_text(problem))}.", icon=":material/error:")
    return "busy"


def waiting_for_turn(folder: background.ScanFolder, job, cancel_key: str) -> None:
    """A job waiting in the server's queue: its place, how many run, and Cancel (it leaves the queue)."""
    place = "next" if job.place == 1 else ordinal(job.place)
    st.progress(0.0, text=f"Waiting for its turn: {place} in the server's queue ({job.running} of "
                          f"{job.limit} job{'s' if job.limit != 1 else ''} running, all visitors together)")
    if st.button("Cancel", key=cancel_key, icon=":material/close:", help="leave the queue"):
        folder.stop(job.key)
        st.rerun(scope="app")


EXPORT_SECONDS = 1800  # a prepared export is offered for this long


def prepare_export(path: str | Path, table: str) -> tuple[str, int]:
    """One table of a scan written as Parquet into this browser's folder (its bytes reserved first, then streamed
    batch by batch: never the whole table in memory), offered for download at a link of its own
    (:mod:`attnviz.ui.downloads`) for :data:`EXPORT_SECONDS`. Returns (the link, the file's bytes). This session's
    previous export is deleted."""
    from attnviz.ui.downloads import offer, withdraw

    folder = scan_folder()
    exports = folder.folder / "exports"
    exports.mkdir(mode=0o700, exist_ok=True)
    withdraw(st.session_state.pop("corpus_export_token", None))
    target = exports / f"{Path(path).stem[:24]}-{table}-{int(time.time() * 1000)}.parquet"
    with folder.reserve(max(Path(path).stat().st_size, 1024**2), target.name, "this export", where=exports):
        try:
            with store.ScanReader(path) as reader:
                reader.export_parquet(table, target)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
    token, link = offer(target, f"{table}.parquet", EXPORT_SECONDS)
    st.session_state["corpus_export_token"] = token
    return link, target.stat().st_size
