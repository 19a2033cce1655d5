"""What keeps one server usable by many sessions: the model cache's bounds and the operator's run log."""

import json
import time

import pytest

from attnviz.models.shipped import DEFAULT_MODEL_NAME, default_model_dir
from attnviz.ui import loaded_models
from attnviz.ui.caches.shared_measurements import SharedMeasurements
from attnviz.ui.frame import logged_run
from tests.tiny_models import make_tiny_checkpoint


@pytest.fixture
def fresh_model_caches():
    loaded_models._bundled_model.clear()
    loaded_models._added_model.clear()
    yield
    loaded_models._added_model.clear()


def test_uploads_never_push_the_bundled_model_out(tmp_path, fresh_model_caches):
    bundled = loaded_models.load_bundle(str(default_model_dir()), DEFAULT_MODEL_NAME)
    added = []
    for index in range(loaded_models.MAX_LOADED_UPLOADS + 2):  # more uploaded models than the cache holds
        folder = make_tiny_checkpoint("gpt2", tmp_path / f"tiny-{index}", seed=index)
        added.append((str(folder), f"tiny-{index}", loaded_models.load_bundle(str(folder), f"tiny-{index}")))
    assert loaded_models.load_bundle(str(default_model_dir()), DEFAULT_MODEL_NAME) is bundled  # not reloaded
    # The most recent uploads are still held; the oldest was evicted and comes back as a fresh load.
    newest_folder, newest_name, newest = added[-1]
    assert loaded_models.load_bundle(newest_folder, newest_name) is newest
    oldest_folder, oldest_name, oldest = added[0]
    assert loaded_models.load_bundle(oldest_folder, oldest_name) is not oldest


def test_forget_loaded_drops_only_that_model(tmp_path, fresh_model_caches):
    first = make_tiny_checkpoint("gpt2", tmp_path / "first", seed=1)
    second = make_tiny_checkpoint("gpt2", tmp_path / "second", seed=2)
    kept = loaded_models.load_bundle(str(first), "first")
    dropped = loaded_models.load_bundle(str(second), "second")
    loaded_models.forget_loaded(str(second), "second", "stored")
    assert loaded_models.load_bundle(str(first), "first") is kept
    assert loaded_models.load_bundle(str(second), "second") is not dropped


def test_the_run_log_records_page_time_and_ending_and_nothing_else(tmp_path, monkeypatch):
    log = tmp_path / "runs.jsonl"
    monkeypatch.setenv("ATTNVIZ_RUN_LOG", str(log))
    with logged_run("Masks", time.perf_counter() - 0.25):
        pass
    with pytest.raises(KeyError), logged_run("Flash vs naive", time.perf_counter()):
        raise KeyError("a secret sentence")
    first, second = (json.loads(line) for line in log.read_text().splitlines())
    assert first["page"] == "Masks" and first["ending"] == "finished" and first["seconds"] >= 0.25
    assert second["page"] == "Flash vs naive" and second["ending"] == "KeyError"
    assert set(first) == set(second) == {"page", "seconds", "ending", "time"}
    assert "secret" not in log.read_text()


def test_no_run_log_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNVIZ_RUN_LOG", raising=False)
    monkeypatch.chdir(tmp_path)
    with logged_run("Masks", time.perf_counter()):
        pass
    assert list(tmp_path.iterdir()) == []


def test_shared_measurements_run_one_at_a_time_and_reuse_results():
    import threading

    store = SharedMeasurements(limit=3)
    running, overlaps, calls = [], [], []

    def measure(key):
        def run():
            running.append(key)
            overlaps.append(len(running))
            time.sleep(0.05)
            running.remove(key)
            calls.append(key)
            return f"result {key}"
        return run

    threads = [threading.Thread(target=store.get, args=(key, measure(key))) for key in ("a", "b", "a", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(overlaps) == 1  # never two measurements at once
    assert sorted(calls) == ["a", "b", "c"]  # the second "a" reused the first
    store.get("d", measure("d"))
    assert len(store.results) == 3  # the least recently used of four went
    value, measured_at = store.get("c", measure("never"))
    assert value == "result c" and measured_at <= time.time()
    assert store.get("c", measure("c"), again=True)[0] == "result c" and calls.count("c") == 2
