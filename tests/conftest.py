import atexit
import os
import shutil
import tempfile

import pytest

from attnviz.system.runtime import configure_environment

# Under pytest-xdist (pytest.ini runs two workers) each worker computes on one thread: two workers of two torch
# threads each on two cores wait on each other's spinning threads. Set before torch loads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

configure_environment()  # offline; no GPU here or in CI, so Triton kernels run in the interpreter
# An exception no page caught fails the test, instead of becoming a message (attnviz.ui.show_unexpected_error).
os.environ["ATTNVIZ_STRICT_ERRORS"] = "1"
# Models "this browser" keeps (attnviz.checkpoints.keep) go to a folder of the test run's own, never the system's.
KEPT = tempfile.mkdtemp(prefix="attnviz-test-kept-")
os.environ["ATTNVIZ_KEEP_DIR"] = KEPT
atexit.register(shutil.rmtree, KEPT, ignore_errors=True)
# The server's queue of background jobs (attnviz.corpus.jobs) too: each test process has its own.
JOBS = tempfile.mkdtemp(prefix="attnviz-test-jobs-")
os.environ["ATTNVIZ_JOBS_DIR"] = JOBS
atexit.register(shutil.rmtree, JOBS, ignore_errors=True)


@pytest.fixture
def clean_streamlit_caches():
    import streamlit as st

    st.cache_resource.clear()
    st.cache_data.clear()
    yield
    st.cache_resource.clear()
    st.cache_data.clear()


@pytest.fixture(scope="module")
def bert():
    """The bundled BERT, loaded once per test module."""
    from tests.tiny_models import bundled_bert

    return bundled_bert()


@pytest.fixture(scope="module")
def pair(bert):
    """A sentence pair captured on the bundled BERT (per module: tests may fill its records' memo)."""
    from attnviz.models.capture import capture

    return capture(bert, "The cat sat on the mat.", "It was tired.")


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """``make(kind, **options)``: a tiny random checkpoint folder (``attnviz.bench.tiny``), made once per module
    and options. ``vision=True`` makes a vision transformer; ``label`` names the folder when an option (a config)
    does not."""
    from attnviz.bench.tiny import make_tiny_checkpoint, make_tiny_vision_checkpoint

    root = tmp_path_factory.mktemp("tiny")

    def make(kind: str, *, vision: bool = False, label: str | None = None, **options):
        folder = root / (label or kind + "".join(f"-{k}{v}" for k, v in sorted(options.items())))
        if not folder.exists():
            (make_tiny_vision_checkpoint if vision else make_tiny_checkpoint)(kind, folder, **options)
        return folder

    return make


# Tests that start servers, browsers or a Ray cluster run one after another on one worker (their own CPU-hungry
# processes beside each other would make their timeouts a matter of luck); the others run by file, so a module's
# fixtures are made once.
SERIAL_GROUP = "servers-browsers-clusters"
# test_hostile_corpora.py starts capped reader processes of up to 1.5 GiB that run for seconds: beside a browser test
# on 2 cores, one of them made a 180 s wait for a 4,096-token figure run out (2026-12-05).
SERIAL_MODULES = {"test_scan_ray.py", "test_concurrent_loads.py", "test_hostile_corpora.py"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        serial = ("e2e" in item.path.parts or item.path.name in SERIAL_MODULES
                  or item.get_closest_marker("serial") is not None)
        group = SERIAL_GROUP if serial else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def installed_attnviz(tmp_path_factory):
    """attnviz pip-installed into a fresh virtual environment, with a home folder outside the checkout."""
    from tests.installed import install

    return install(tmp_path_factory.mktemp("installed"))
