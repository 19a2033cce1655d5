"""A corpus scan per checkpoint of a series (attnviz.corpus.series.scans): each step's map of every statistic equals a
scan run directly on that checkpoint with the scan's own API (its folder loaded as the Heads across a corpus page
loads a model, scanned into a file of its own); a stopped run goes on without scanning again what it scanned, a
series measured before is scanned without being measured again, a finished one does nothing; Ray gives the same
measures and maps (the series' one Ray test); another corpus, a missing one and an unknown statistic are refused in
words; a file without scans reads as none."""

import shutil

import duckdb
import numpy as np
import pytest

from attnviz.api import series as api
from attnviz.corpus.document_files import open_corpus
from attnviz.corpus.scan.runner import ScanSettings, run_scan
from attnviz.corpus.scan.store import ScanReader
from attnviz.corpus.series import folder as sfolder
from attnviz.corpus.series import runner as sr
from attnviz.corpus.series import store as sstore
from attnviz.corpus.series.scans import MAPPED, scan_path
from attnviz.models.loading import load_model_dir
from tests.test_series import assert_same_rows, copy_tokenizer, make_series, one_thread  # noqa: F401 - a fixture

STEPS = (100, 200)  # two checkpoints of different weights: a map that moves over training
DOCUMENTS, TOKENS = 5, 24
PROBE = dict(windows=2, sequences=2)  # a small probe: these tests are about the scans
LINES = ["the cat sat on the mat and the cat sat on the mat again",
         "one two three four one two three four one two three four",
         "a dog ran to the park, and the dog ran home from the park.",
         "def f(x): return x + 1; def g(x): return f(x) * 2",
         "red green blue red green blue red green blue",
         "this line is past the documents a scan reads"]


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """step100/ and step200/ (different weights), the tokenizer once in the series folder."""
    return make_series(tmp_path_factory.mktemp("scanned-series"), STEPS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "lines.txt"
    path.write_text("\n".join(LINES) + "\n")
    return path


def settings_with(corpus, **more) -> sr.SeriesSettings:
    return sr.SeriesSettings(**{**PROBE, "corpus": str(corpus), "scan_docs": DOCUMENTS, "scan_tokens": TOKENS, **more})


@pytest.fixture(scope="module")
def scanned(series, corpus, tmp_path_factory):
    """The series measured and scanned in one run, in-process."""
    path = tmp_path_factory.mktemp("scanned") / "series.duckdb"
    state = sr.run_series(series, path, settings_with(corpus))
    assert state.status == sstore.STATUS_FINISHED and state.done == state.planned == len(STEPS)
    return path


@pytest.fixture(scope="module")
def direct_maps(series, corpus, tmp_path_factory):
    """Each checkpoint scanned on its own with the scan's API: ``{step: {statistic: [layers, heads]}}``."""
    where = tmp_path_factory.mktemp("direct")
    found = {}
    for step in STEPS:
        folder = where / f"step{step}"
        shutil.copytree(series / f"step{step}", folder)
        copy_tokenizer(folder)  # a checkpoint folder as the Heads across a corpus page takes it
        bundle = load_model_dir(folder, dtype="fp32")
        documents = open_corpus(str(corpus), keep=DOCUMENTS)
        run_scan(documents, bundle, where / f"{step}.duckdb",
                 ScanSettings(max_docs=DOCUMENTS, max_tokens=TOKENS, qk_points=0))
        with ScanReader(where / f"{step}.duckdb") as reader:
            found[step] = {name: reader.statistic_map(name)[0] for name in MAPPED}
    return found


def maps_of(path) -> dict[str, dict[int, np.ndarray]]:
    with sstore.SeriesReader(path) as reader:
        return {name: reader.scan_maps(name) for name in MAPPED}


def assert_same_maps(found: dict, expected: dict, rtol: float = 1e-6) -> None:
    for name in MAPPED:
        assert sorted(found[name]) == sorted(expected[name])
        for step in expected[name]:
            np.testing.assert_allclose(found[name][step], expected[name][step], rtol=rtol, atol=1e-9, equal_nan=True,
                                       err_msg=f"{name} at step {step}")


def test_each_steps_map_equals_a_scan_of_that_checkpoint_alone(scanned, direct_maps, series):
    found = maps_of(scanned)
    expected = {name: {step: direct_maps[step][name] for step in STEPS} for name in MAPPED}
    assert_same_maps(found, expected)
    previous = found["previous"]
    assert not np.allclose(previous[STEPS[0]], previous[STEPS[-1]])  # the checkpoints differ, and so do their maps
    # the notebook API: the same maps as lists, and the statistics some head has
    listed = api.series_scan_maps(scanned, "previous")
    assert list(listed) == list(STEPS) and all(np.allclose(listed[step], previous[step]) for step in STEPS)
    statistics = api.series_scan_statistics(scanned)
    assert {"entropy", "previous", "first", "duplicate", "induction"} <= set(statistics)
    assert "next" not in statistics  # a causal model gives later keys no weight: no head has it
    assert statistics == [name for name in MAPPED if name in statistics]  # in the scan page's order
    # each checkpoint's scan file is let go once its maps are in the series' file
    assert sorted(path.name for path in scanned.parent.iterdir()) == ["series.duckdb"]
    with duckdb.connect(str(scanned), read_only=True) as connection:
        assert connection.execute("SELECT count(*), min(documents), max(documents) FROM scan_steps").fetchone() == (
            len(STEPS), DOCUMENTS, DOCUMENTS)


def test_a_stopped_run_goes_on_without_scanning_again_and_a_finished_one_does_nothing(series, corpus, scanned,
                                                                                         tmp_path):
    path = tmp_path / "stopped.duckdb"
    asked = []
    state = sr.run_series(series, path, settings_with(corpus, keep_scans=True),
                          should_stop=lambda: asked.append(1) or len(asked) > 1)
    assert state.status == sstore.STATUS_STOPPED and state.done == 1
    first_scan = scan_path(path, STEPS[0]).stat().st_mtime_ns  # kept, as asked

    def scanned_at():
        with duckdb.connect(str(path), read_only=True) as connection:
            return dict(connection.execute("SELECT step, scanned_at FROM scan_steps").fetchall())

    before = scanned_at()
    assert list(before) == [STEPS[0]]
    state = sr.run_series(series, path, settings_with(corpus, keep_scans=True))
    assert state.status == sstore.STATUS_FINISHED and state.done_this_run == len(STEPS) - 1
    after = scanned_at()
    assert after[STEPS[0]] == before[STEPS[0]] and sorted(after) == list(STEPS)  # step 100 was not scanned again
    assert scan_path(path, STEPS[0]).stat().st_mtime_ns == first_scan
    assert scan_path(path, STEPS[0]).name == "stopped.step100.scan.duckdb"
    with ScanReader(scan_path(path, STEPS[-1])) as reader:  # a kept scan is a scan the Heads across a corpus page opens
        assert reader.documents == DOCUMENTS and reader.settings["status"] == "finished"
    assert_same_maps(maps_of(path), maps_of(scanned), rtol=1e-9)
    state = sr.run_series(series, path, settings_with(corpus, keep_scans=True))
    assert state.finished_before and state.done_this_run == 0 and scanned_at() == after


def test_a_series_measured_before_is_scanned_without_being_measured_again(series, corpus, scanned, tmp_path):
    path = tmp_path / "later.duckdb"
    shutil.copy(scanned, path)  # the same series measured without a corpus, by an attnviz before the scans' tables
    with duckdb.connect(str(path)) as connection:
        connection.execute("DROP TABLE scan_heads")
        connection.execute("DROP TABLE scan_steps")
    assert api.series_scan_statistics(path) == [] and api.series_scan_maps(path, "previous") == {}
    with duckdb.connect(str(path), read_only=True) as connection:
        measured_at = connection.execute("SELECT step, measured_at FROM steps ORDER BY step").fetchall()
    state = sr.run_series(series, path, settings_with(corpus))
    assert state.status == sstore.STATUS_FINISHED and state.done_this_run == len(STEPS)
    with duckdb.connect(str(path), read_only=True) as connection:
        assert connection.execute("SELECT step, measured_at FROM steps ORDER BY step").fetchall() == measured_at
        assert connection.execute("SELECT count(*) FROM steps").fetchone()[0] == len(STEPS)
        assert connection.execute("SELECT count(*) FROM head_scores").fetchone()[0] == len(STEPS) * 2 * 2
    assert_same_maps(maps_of(path), maps_of(scanned), rtol=1e-9)
    assert sstore.open_series(path).rows == sstore.open_series(scanned).rows  # the measures are the same too


def test_another_corpus_a_missing_one_and_an_unknown_statistic_are_refused_in_words(series, corpus, scanned,
                                                                                     tmp_path):
    copy = tmp_path / "copy.duckdb"
    shutil.copy(scanned, copy)
    other = tmp_path / "other.txt"
    other.write_text("\n".join(reversed(LINES)) + "\n")
    with pytest.raises(sfolder.SeriesRefused, match="holds scans of another corpus"):
        sr.run_series(series, copy, settings_with(other))
    with pytest.raises(sfolder.SeriesRefused, match="holds scans of another corpus"):  # other limits, the same corpus
        sr.run_series(series, copy, settings_with(corpus, scan_docs=DOCUMENTS - 1))
    with pytest.raises(sfolder.SeriesRefused, match="the corpus cannot be scanned: no corpus file at"):
        sr.run_series(series, tmp_path / "new.duckdb", settings_with(tmp_path / "nowhere.txt"))
    with pytest.raises(sfolder.SeriesRefused, match="a scan reads 2 to"):
        sr.SeriesSettings(corpus=str(corpus), scan_tokens=1)
    with pytest.raises(ValueError, match="is not a statistic a scan keeps"):
        api.series_scan_maps(scanned, "loss")
    # the probe's key is the same with a corpus or without: the same series is the same file
    assert sr.series_key(series, settings_with(corpus)) == sr.series_key(series, sr.SeriesSettings(**PROBE))


def series_on_ray(series: str, path: str, corpus: str) -> dict:
    """The run on Ray, in the child process of :mod:`tests.ray_child` (a cluster of its own)."""
    from attnviz.corpus.series.on_ray import run_series_on_ray

    return {"status": run_series_on_ray(series, path, settings_with(corpus), address=None, workers=1).status}


@pytest.mark.slow
@pytest.mark.serial
def test_ray_gives_the_same_measures_and_maps_as_the_run_here(series, corpus, scanned, tmp_path):
    """Each actor loads, measures and scans its checkpoints; the driver commits them as the run here does."""
    from tests.ray_child import on_ray

    state = on_ray("tests.test_series_scans:series_on_ray", series=str(series), path=str(tmp_path / "ray.duckdb"),
                   corpus=str(corpus))
    assert state["status"] == sstore.STATUS_FINISHED
    assert_same_maps(maps_of(tmp_path / "ray.duckdb"), maps_of(scanned), rtol=1e-5)
    assert_same_rows(sstore.open_series(tmp_path / "ray.duckdb").rows, sstore.open_series(scanned).rows, rel=1e-5,
                     abs_=1e-6)


def test_the_pages_words_for_a_step_that_was_not_scanned_and_one_colour_range_for_every_step():
    from attnviz.pagelogic import series_scans as words

    scanned_steps = [100, 200, 400]
    assert [words.step_shown(wanted, scanned_steps) for wanted in (None, 50, 100, 250, 400, 900)] == [
        400, 100, 100, 200, 400, 400]  # the latest scanned at or before the step; the first before any
    grids = {100: np.array([[0.2, 0.9], [np.nan, 0.1]]), 200: np.array([[0.5, 0.3], [2.5, 0.0]])}
    caption = words.map_caption("entropy", 200, 250, grids)
    assert caption.startswith("Step 250 was not scanned: the map is step 200's. Highest at step 200: L1 H0 (2.5), "
                              "which had no value at step 100. Move the step")
    assert "L0 H1 (0.9)" in words.map_caption("entropy", 100, 100, grids)
    assert words.map_caption("entropy", 100, 100, {100: grids[100]}).endswith("One step is scanned so far.")
    assert "L0 H0 (1)" in words.map_caption("entropy", 100, 100, {100: np.array([[1.0, np.inf]])})  # inf: no value
    values = np.concatenate([grid.ravel() for grid in grids.values()])
    assert words.value_range("entropy", grids) == (np.nanmin(values), np.nanmax(values))  # over every step
    assert words.value_range("previous", grids) == (0.0, 1.0)  # a share of weight
    assert words.default_statistic(["entropy", "previous"]) == "previous"
    assert words.statistic_name("induction head") == "documents labelled 'induction head'"
