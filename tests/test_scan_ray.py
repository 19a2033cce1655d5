"""The scan on a local Ray cluster (2 CPUs, 2 actors each holding a model replica) writes the same tables as the
in-process scan, and a Ray scan stopped midway resumes in-process to the same result."""

import pytest

from attnviz.corpus.on_ray import ray_available
from attnviz.corpus.scan import store
from attnviz.corpus.scan.on_ray import run_scan_on_ray
from attnviz.corpus.scan.runner import ScanSettings, run_scan
from tests.test_scan import TEXTS, assert_same_tables, small_corpus, tables

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not ray_available(), reason="Ray is an optional extra")]


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def test_ray_gives_the_same_tables_as_in_process(bert, local_ray, tmp_path):
    corpus = small_corpus()
    settings = ScanSettings(max_docs=10, max_tokens=20, chunk_docs=2)
    run_scan(corpus, bert, tmp_path / "local.duckdb", settings)
    seen = []
    state = run_scan_on_ray(corpus, bert, tmp_path / "ray.duckdb", settings, address=None, workers=2,
                            progress=lambda s: seen.append(s.done))
    assert state.status == store.STATUS_FINISHED and state.done == len(TEXTS)
    assert seen[-1] == len(TEXTS) and len(seen) >= 3  # progress after every block
    assert_same_tables(tables(tmp_path / "local.duckdb"), tables(tmp_path / "ray.duckdb"), rtol=2e-5, atol=1e-6)

    # Stopped after its first block on Ray, then resumed in this process: the same tables again
    stopped = tmp_path / "stopped.duckdb"
    state = run_scan_on_ray(corpus, bert, stopped, settings, address=None, workers=1, should_stop=lambda: True)
    assert state.status == store.STATUS_STOPPED and 0 < state.done < len(TEXTS)
    run_scan(corpus, bert, stopped, settings)
    assert_same_tables(tables(tmp_path / "local.duckdb"), tables(stopped), rtol=2e-5, atol=1e-6)
