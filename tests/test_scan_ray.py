"""The scan on a local Ray cluster (2 CPUs, 2 actors each holding a model replica) writes the same tables as the
in-process scan, and a Ray scan stopped midway resumes in-process to the same result. The cluster runs in a child
process (:mod:`tests.ray_child`)."""

import pytest

from attnviz.corpus.scan import store
from attnviz.corpus.scan.runner import ScanSettings, run_scan
from tests.test_scan import TEXTS, assert_same_tables, small_corpus, tables

SETTINGS = ScanSettings(max_docs=10, max_tokens=20, chunk_docs=2)


def scans_on_ray(whole: str, stopped: str) -> dict:
    """In the child: a whole scan on two actors, and one on one actor asked to stop after its first block."""
    from attnviz.corpus.scan.on_ray import run_scan_on_ray
    from tests.tiny_models import bundled_bert

    bert = bundled_bert()
    seen = []
    state = run_scan_on_ray(small_corpus(), bert, whole, SETTINGS, address=None, workers=2,
                            progress=lambda s: seen.append(s.done))
    stopped_state = run_scan_on_ray(small_corpus(), bert, stopped, SETTINGS, address=None, workers=1,
                                    should_stop=lambda: True)
    return {"status": state.status, "done": state.done, "seen": seen,
            "stopped_status": stopped_state.status, "stopped_done": stopped_state.done}


@pytest.mark.slow
def test_ray_gives_the_same_tables_as_in_process(bert, tmp_path):
    from tests.ray_child import on_ray

    corpus = small_corpus()
    run_scan(corpus, bert, tmp_path / "local.duckdb", SETTINGS)
    stopped = tmp_path / "stopped.duckdb"
    answer = on_ray("tests.test_scan_ray:scans_on_ray", whole=str(tmp_path / "ray.duckdb"), stopped=str(stopped))
    assert answer["status"] == store.STATUS_FINISHED and answer["done"] == len(TEXTS)
    assert answer["seen"][-1] == len(TEXTS) and len(answer["seen"]) >= 3  # progress after every block
    assert_same_tables(tables(tmp_path / "local.duckdb"), tables(tmp_path / "ray.duckdb"), rtol=2e-5, atol=1e-6)

    # Stopped after its first block on Ray, then resumed in this process: the same tables again
    assert answer["stopped_status"] == store.STATUS_STOPPED and 0 < answer["stopped_done"] < len(TEXTS)
    run_scan(corpus, bert, stopped, SETTINGS)
    assert_same_tables(tables(tmp_path / "local.duckdb"), tables(stopped), rtol=2e-5, atol=1e-6)


def test_no_test_starts_ray_in_the_pytest_worker():
    """A cluster started in a pytest-xdist worker can take the worker down with it (tests/ray_child.py says how):
    every test's cluster starts in the child of tests.ray_child."""
    from pathlib import Path

    starts = ("ray" + ".init(", "start" + "_ray(", "joined" + "_ray(")  # split: this file would name itself
    tests = Path(__file__).parent
    found = sorted(f"{path.relative_to(tests)}: {start}" for path in tests.rglob("*.py") if path.name != "ray_child.py"
                   for start in starts if start in path.read_text(encoding="utf-8"))
    assert found == []
