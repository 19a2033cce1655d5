"""The one Ray runner: a strategy (:data:`attnviz.corpus.runner.Measure`) that measures a run's chunks on a Ray
cluster. The documents go as Ray Data blocks, one chunk each, through a pool of actors, each holding one replica of
the model (one GPU each where the cluster has GPUs) built by the run's :attr:`ChunkWork.replica`; the blocks come
back in corpus order and the driver records each like an in-process chunk, so the database is the same either way
(the sums up to the order of floating-point additions) and a run stopped on Ray resumes in-process or on Ray alike.

Ray is joined (or, for "auto" with no cluster running, started) when the first chunk is measured, and a cluster
started here is shut down once the chunks are done or stopped. Ray is an optional extra (``pip install
"ray[data]"``; the README's test setup installs it).
"""

from __future__ import annotations

import contextlib
import functools
import pickle
from collections.abc import Callable, Iterator

from attnviz.corpus.documents import Document
from attnviz.corpus.runner import ChunkWork, Documents, Measure, StopAsked, Stopped
from attnviz.corpus.scan.runner import ScanRefused


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError:
        return False
    return True


def start_ray(address: str | None, num_cpus: int | None = None) -> bool:
    """Connect to (or, for "auto" without a running cluster, start) Ray; True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    if address in (None, "auto", "local"):
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    return True


@contextlib.contextmanager
def joined_ray(address: str | None) -> Iterator[None]:
    """Ray for the time of the block; shut down after it when this started it."""
    started_here = start_ray(address)
    try:
        yield
    finally:
        if started_here:
            import ray

            ray.shutdown()


class ChunkActor:
    """One model replica (built once by the run's recipe): measures the chunk of each block it is given."""

    def __init__(self, replica: Callable[[], Callable[[Documents], object]], threads: int):
        import torch

        from attnviz.system.runtime import configure_environment

        configure_environment()
        torch.set_num_threads(max(1, threads))
        self.measure = replica()

    def __call__(self, batch: dict) -> dict:
        documents = [(int(doc), Document(str(text), str(source)))
                     for doc, text, source in zip(batch["doc"], batch["text"], batch["source"], strict=True)]
        return {"result": [pickle.dumps(self.measure(documents))], "docs": [[doc for doc, _ in documents]]}


def measure_on_ray(work: ChunkWork, todo: Documents, should_stop: StopAsked, *, address: str | None, workers: int,
                   threads_per_worker: int) -> Iterator[tuple[Documents, object]]:
    """``todo`` measured by ``workers`` actors, each chunk given back in corpus order; a stop is asked after each
    chunk is recorded (the blocks already sent are dropped)."""
    if not todo:
        return
    import ray
    import ray.data

    with joined_ray(address):
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True  # blocks arrive in corpus order: the same sums
        context.enable_progress_bars = False  # the run reports its own progress
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        blocks = ray.data.from_items(
            [{"doc": doc, "text": document.text, "source": document.source} for doc, document in todo],
            override_num_blocks=max(1, -(-len(todo) // work.chunk_docs)))
        measured = blocks.map_batches(
            ChunkActor, batch_size=work.chunk_docs, concurrency=max(1, workers), num_gpus=gpus,
            num_cpus=threads_per_worker, fn_constructor_args=(work.replica, threads_per_worker))
        by_doc = dict(todo)
        for row in measured.iter_rows():
            # made by our own actors, never read from a user's file
            yield [(doc, by_doc[doc]) for doc in row["docs"]], pickle.loads(row["result"])
            if should_stop is not None and should_stop():
                raise Stopped


def on_ray(address: str | None = "auto", workers: int = 2, threads_per_worker: int = 1, *,
           what: str = "run") -> Measure:
    """The strategy that measures a run's chunks on Ray: ``workers`` actors of ``threads_per_worker`` CPUs each;
    ``address`` a cluster's address, or "auto" (the local cluster, started if none runs). Refused now, before
    anything is loaded, when Ray is not installed (``what``: the run, as the refusal says it)."""
    if not ray_available():
        raise ScanRefused(f"Ray is not installed: pip install 'ray[data]', or {what} in-process (without --ray)")
    return functools.partial(measure_on_ray, address=address, workers=workers, threads_per_worker=threads_per_worker)
