"""The Over training page's other source: a series of the user's checkpoints (a folder on the server, one folder per
checkpoint named with its step), measured in the background into DuckDB (:mod:`attnviz.corpus.series`) and read back
as the :class:`~attnviz.interventions.training_runs.Run` the page draws. The folder is typed (only where the server
reads folders: :func:`attnviz.ui.session_models.server_folders_allowed`, inside ``ATTNVIZ_MODEL_ROOT`` when it is
set), checked before anything starts (every checkpoint's files, their shapes and tokenizer, the probe: refusals in
words), then measured by a job of the server's queue with its progress, a Stop, and a Resume that goes on with the
steps not measured yet. With "Scan a corpus at each checkpoint" (off by default), each checkpoint is also scanned over
the bundled corpus (:mod:`attnviz.corpus.series.scans`), and a statistic's layer x head map is drawn at the step of
the page's step slider (``ot_step``), so that the map plays over training. Widgets keyed ``ot_series_*``."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import streamlit as st

from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.checkpoints.uploads import model_root, prepare_folder_path
from attnviz.core.units import human_bytes
from attnviz.corpus import background
from attnviz.corpus import jobs as background_jobs
from attnviz.corpus.database import DatabaseBusy
from attnviz.corpus.documents import BUNDLED
from attnviz.corpus.jobs import JobRefused
from attnviz.corpus.scan.disk import estimated_scan_bytes
from attnviz.corpus.scan.runner import ScanRefused
from attnviz.corpus.series import folder as series_folder
from attnviz.corpus.series import probe as series_probe
from attnviz.corpus.series import runner as series_runner
from attnviz.corpus.series.store import STATUS_FINISHED, SeriesReader, open_series
from attnviz.interventions.training_runs import Run
from attnviz.pagelogic import series_scans as scan_words
from attnviz.ui.caches.store import file_stamp
from attnviz.ui.figures import figure_once, show_figure
from attnviz.ui.messages import problem_text
from attnviz.ui.scans import scan_folder, session_id, waiting_for_turn
from attnviz.ui.session_models import server_folders_allowed
from attnviz.viz import series_scans as scan_figures

SETTINGS = series_runner.DEFAULT_SETTINGS  # the probe the bundled tiny GPT's own run is measured on
DTYPE = "fp32"
LAYOUT = ("one folder per checkpoint, each named with its step: step1000/, step2000/, … (Pythia's revisions) or "
          "checkpoint-500/, ckpt_step_1200/, …, each with its config.json and model.safetensors; the tokenizer's "
          "files in each, or once in the series folder")


def series_jobs() -> background.ScanFolder:
    """This browser's series measures: a folder beside its scans (one job at a time, all kinds together)."""
    scans = scan_folder()
    return background.ScanFolder(scans.folder / "series", owner=scans.owner)


def folder_stamp(folder: Path) -> tuple:
    """What changes when checkpoints are added to, removed from or rewritten in a series folder (its entries and
    theirs, by modification time): part of the key of what is cached from it."""
    stamps = []
    try:
        with os.scandir(folder) as entries:
            for count, entry in enumerate(entries):
                if count >= series_folder.MOST_ENTRIES:
                    break
                try:
                    stamps.append((entry.name, entry.stat().st_mtime_ns))
                except OSError:
                    continue
    except OSError:
        return ()
    return tuple(sorted(stamps))


@st.cache_data(max_entries=8, show_spinner="Checking the checkpoints…")
def series_facts(folder: str, stamp: tuple) -> dict:
    """The series in ``folder`` checked as a run checks it (its checkpoints, their shape and tokenizer, the probe):
    its steps and shape, or ``{"refused": why}`` (a refusal is kept too, so a rerun does not check again)."""
    try:
        series = series_folder.find_series(folder)
        tokenizer = series_folder.series_tokenizer(series)
        text = series_probe.probe_text(SETTINGS.text_file)
        series_probe.series_probe(tokenizer, text, SETTINGS, series.shape)
    except (ScanRefused, CheckpointRefused, OSError) as problem:
        return {"refused": str(problem).rstrip(".")}
    return {"steps": series.steps, "describe": series.describe(), "layers": series.layers, "heads": series.heads,
            "notes": series.notes}


CHARACTERS_PER_TOKEN = 16  # a bound on the characters of a scanned token, for the disk a checkpoint's scan takes


def estimated_bytes(steps: int, layers: int, heads: int, settings: series_runner.SeriesSettings = SETTINGS) -> int:
    """At most what a series' database takes on disk: a row per checkpoint, and per checkpoint and head; scanned
    over a corpus, a map per statistic, checkpoint and head, and one checkpoint's scan file at a time."""
    measures = steps * (layers * heads * 96 + 4096) + 16 * 1024**2
    if settings.corpus is None:
        return int(measures)
    maps = steps * (layers * heads * len(scan_words.STATISTIC_NAMES) * 2 * 64 + 4096)
    scan_file = estimated_scan_bytes(settings.scan_docs, settings.scan_tokens, layers, heads,
                                     settings.scan_docs * settings.scan_tokens * CHARACTERS_PER_TOKEN)
    return int(measures + maps + scan_file)


def chosen_settings() -> series_runner.SeriesSettings:
    """The probe, and the bundled corpus where the page's "scan a corpus" is on (off by default)."""
    scanned = st.toggle("Scan a corpus at each checkpoint", key="ot_series_scan", value=False,
                        help=f"Each checkpoint is also scanned over the first {SETTINGS.scan_docs} documents of the "
                             "bundled corpus (Python's documentation and docstrings), "
                             f"{SETTINGS.scan_tokens} tokens each, as the Heads across a corpus page scans a model: "
                             "any statistic's layer x head map can then be played over training with the step "
                             "slider. Checkpoints measured before are scanned only.")
    return dataclasses.replace(SETTINGS, corpus=BUNDLED) if scanned else SETTINGS


@st.cache_data(max_entries=16, show_spinner=False)
def _scanned(path: str, stamp: tuple) -> dict:
    with SeriesReader(path) as reader:
        steps, documents = reader.scan_facts()
        return {"steps": steps, "statistics": reader.scan_statistics(), "documents": documents}


@st.cache_data(max_entries=32, show_spinner=False)
def _maps(path: str, statistic: str, stamp: tuple) -> dict[int, np.ndarray]:
    with SeriesReader(path) as reader:
        return reader.scan_maps(statistic)


def stamp_of(path: Path) -> tuple:
    return (file_stamp(path), file_stamp(path.with_name(path.name + ".wal")))


def scanned_facts(path: Path) -> dict:
    """The steps scanned into the series' file so far, its statistics and documents (none while a writer holds
    it, or before it exists)."""
    empty = {"steps": [], "statistics": [], "documents": 0}
    if not path.is_file():
        return empty
    try:
        return _scanned(str(path), stamp_of(path))
    except DatabaseBusy:
        return empty
    except Exception:  # noqa: BLE001 - a damaged file: open_series's reading says it in words
        return empty


@st.cache_resource(max_entries=8, show_spinner=False)
def _read(path: str, stamp: tuple) -> Run:
    return open_series(path)


def measured_run(path: Path) -> Run | None:
    """The series measured into ``path`` so far (None before its first checkpoint); while a writer holds the file,
    the last one read."""
    remembered = st.session_state.get("ot_series_last")
    if not path.is_file():
        return None
    wal = path.with_name(path.name + ".wal")
    try:
        run = _read(str(path), (file_stamp(path), file_stamp(wal)))
    except DatabaseBusy:
        return remembered[1] if remembered and remembered[0] == str(path) else None
    except Exception as problem:  # noqa: BLE001 - cut short, damaged, not a series' file: said in words
        st.error(f"The measures cannot be read: {problem_text(problem).rstrip('.')}.", icon=":material/error:")
        return None
    if not run.rows:
        return None
    st.session_state["ot_series_last"] = (str(path), run)
    return run


def series_source() -> Run | None:
    """The series chosen on the page, as far as it is measured (None before any checkpoint is): its folder, the
    start (or resume) of its measures in the background, their progress and Stop, errors in words."""
    if not server_folders_allowed():
        st.info("This server reads no folders on its disk (ATTNVIZ_SERVER_FOLDERS=0), so it measures no series of "
                "yours here. Measure one on your machine with `attnviz series FOLDER --db series.duckdb` and open it "
                "in a notebook with `attnviz.open_series`.", icon=":material/info:")
        return None
    root = model_root()
    typed = st.text_input("A folder of checkpoints on the server", key="ot_series_folder",
                          placeholder="/path/to/run (step1000/, step2000/, …)",
                          help=f"The folder of a training run: {LAYOUT}."
                               + (f" Folders are read from inside {root} on this server." if root else ""))
    if not typed.strip():
        st.caption(f":material/folder_open: Give a folder of checkpoints: {LAYOUT}. Each is measured on the probe the "
                   "bundled tiny GPT's own run is measured on, one after the other, in the background.")
        return None
    try:
        folder, _, _ = prepare_folder_path(typed)
    except CheckpointRefused as problem:
        st.error(f"This folder cannot be used: {str(problem).rstrip('.')}.", icon=":material/block:")
        return None
    facts = series_facts(str(folder), folder_stamp(folder))
    if "refused" in facts:
        st.error(f"This folder cannot be measured as a series: {facts['refused']}.", icon=":material/block:")
        return None
    settings = chosen_settings()
    jobs = series_jobs()
    key = series_runner.series_key(folder, settings, DTYPE)  # the same file with a corpus or without
    path = jobs.database(key)
    st.session_state["ot_series_path"] = str(path)
    running = jobs.job()
    run = measured_run(path)
    scanned = scanned_facts(path)
    series_controls(folder, facts, settings, jobs, key, run, running, scanned["steps"])
    if scanned["steps"]:
        scan_map_view(path, scanned)
    return run


def series_controls(folder: Path, facts: dict, settings: series_runner.SeriesSettings, jobs: background.ScanFolder,
                    key: str, run: Run | None, running, scanned_steps: list[int]) -> None:
    """The series' job: its progress and Stop while it runs, else what is left and the button that starts it."""
    measured = set(run.steps) if run is not None else set()
    scanned = set(scanned_steps) if settings.corpus is not None else set(facts["steps"])
    unmeasured = [step for step in facts["steps"] if step not in measured]
    left = [step for step in facts["steps"] if step not in measured or step not in scanned]
    reserved = estimated_bytes(len(facts["steps"]), facts["layers"], facts["heads"], settings)
    scanning = " and scanned over the bundled corpus" if settings.corpus is not None else ""
    st.caption(f"{facts['describe']}. Each checkpoint is loaded, measured{scanning} and let go in a process of its "
               f"own (the server runs at most {background_jobs.job_limit()} jobs at once, the rest wait their turn), "
               f"with up to {human_bytes(reserved)} of disk reserved: leave the page or reload, it goes on; the same "
               "folder reopens the same measures.")
    if running is not None and running.key == key:
        series_progress(jobs)
        return
    if running is not None:
        st.info("Another job of this browser is running (a scan or another run): this series can be measured once "
                "it ends, or after its Stop.", icon=":material/pending:")
    said = jobs.progress(key)
    if said and said.get("status") == "failed":
        st.error(f"The measures stopped: {str(said.get('error', 'an unknown problem')).rstrip('.')}.",
                 icon=":material/error:")
    if not left:
        st.success(f"Every checkpoint is measured ({len(measured):,})"
                   + (" and scanned over the corpus." if settings.corpus is not None else "."),
                   icon=":material/check_circle:")
        return
    checkpoints = f"{len(left):,} checkpoint{'s' if len(left) != 1 else ''}"
    if run is None:
        verb = "Measure and scan" if settings.corpus is not None else "Measure"
        label, button_key = f"{verb} {checkpoints}", "ot_series_start"
    elif not unmeasured:
        label, button_key = f"Scan {checkpoints} over the corpus", "ot_series_resume"
    else:
        label, button_key = f"Resume: {checkpoints} left", "ot_series_resume"
    if st.button(label, type="primary", key=button_key, icon=":material/play_arrow:", disabled=running is not None):
        try:
            jobs.start_series(key, folder, settings, dtype=DTYPE, disk_bytes=reserved, session=session_id())
        except (JobRefused, CheckpointRefused, ScanRefused) as problem:
            st.error(f"The measures cannot start: {str(problem).rstrip('.')}.", icon=":material/block:")
            return
        st.session_state["ot_series_seen"] = -1
        st.rerun()


def progress_words(said: dict, seconds: float) -> tuple[float, str]:
    """The progress bar, ``(share done, words)``, from the job's progress record ``said`` ({} before the first)."""
    if not said:
        return 0.0, f"Starting (checking the checkpoints, reading the tokenizer): {seconds:.0f} s"
    done, planned = int(said.get("done", 0)), int(said.get("planned", 0) or 1)
    step = said.get("step")
    last = f" · step {step:,} took {said.get('seconds', 0.0):.1f} s" if isinstance(step, int) else ""
    eta = said.get("eta")
    left = "" if eta is None else f" · about {int(eta) // 60} min {int(eta) % 60:02d} s left"
    return min(1.0, done / planned), f"Measuring: {done:,} of {planned:,} checkpoints{last}{left}"


@st.fragment(run_every=1.0)
def series_progress(jobs: background.ScanFolder) -> None:
    """The running job's progress, refreshed every second; the whole page reruns after each checkpoint (its measures
    are drawn as they come) and when the job ends."""
    job = jobs.job()
    if job is None:
        st.rerun(scope="app")
    if job.waiting:
        waiting_for_turn(jobs, job, "ot_series_cancel")
        return
    said = jobs.progress(job.key) or {}
    share, text = progress_words(said, time.time() - job.started)
    st.progress(share, text=text)
    done = int(said.get("done", -1)) if said.get("status") != STATUS_FINISHED else -2
    if st.session_state.get("ot_series_seen") not in (None, done):
        st.session_state["ot_series_seen"] = done
        st.rerun(scope="app")
    st.session_state["ot_series_seen"] = done
    if st.button("Stop", key="ot_series_stop", icon=":material/stop:",
                 help="stops after the checkpoint being measured; every measured checkpoint is kept, and Resume goes "
                      "on from there"):
        jobs.stop(job.key)
        st.toast("Stopping after this checkpoint…")


def scan_map_view(path: Path, scanned: dict) -> None:
    """A statistic's layer x head map at the step of the page's step slider (``ot_step``; the latest scanned step at
    or before it), on one colour range for every step: moving the step plays the map over training. Maps are read
    once per statistic and version of the file, and each step's figure is built once."""
    statistics = scanned["statistics"]
    if not statistics:
        return
    st.subheader("A statistic's map over training")
    statistic = st.selectbox("Statistic", statistics, index=statistics.index(scan_words.default_statistic(statistics)),
                             format_func=scan_words.statistic_name, key="ot_series_statistic",
                             help="What the Heads across a corpus page maps for a scan, here for each checkpoint's "
                                  "scan of the corpus; statistics no head has at any step are left out.")
    stamp = stamp_of(path)
    try:
        maps = _maps(str(path), statistic, stamp)
    except DatabaseBusy:
        st.caption("The scans are being written: the map comes back after this checkpoint.")
        return
    except Exception as problem:  # noqa: BLE001 - a damaged file: said in words
        st.error(f"The scans cannot be read: {problem_text(problem).rstrip('.')}.", icon=":material/error:")
        return
    if not maps:
        return
    wanted = st.session_state.get("ot_step")
    step = scan_words.step_shown(wanted if isinstance(wanted, int) else None, sorted(maps))
    figure = figure_once(("series scan map", str(path), stamp, statistic, step), lambda: scan_figures.step_map(
        maps[step], statistic=statistic, title=scan_words.map_title(statistic, step, scanned["documents"]),
        value_range=scan_words.value_range(statistic, maps)))
    show_figure(figure, scan_words.map_caption(statistic, step, wanted if isinstance(wanted, int) else None, maps),
                key="ot_series_map")
