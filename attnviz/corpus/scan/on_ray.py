"""The same scan on a Ray cluster: the documents as Ray Data blocks through a pool of actors, each holding one
replica of the model (one GPU each where the cluster has GPUs), each block's :class:`~attnviz.corpus.scan.heads.Partial`
merged on the driver and committed like an in-process chunk, so the database is the same either way (the sums up to
the order of floating-point additions) and a stopped Ray scan resumes in-process or on Ray alike.

Ray is an optional extra (``pip install "ray[data]"``; the README's test setup installs it).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

from attnviz.corpus.documents import Corpus, Document
from attnviz.corpus.scan import store
from attnviz.corpus.scan.runner import (
    DEFAULT_SETTINGS,
    Progress,
    ScanRefused,
    ScanSettings,
    check_token_limit,
    finish,
    keep_sample,
    open_writer,
    record_chunk,
    resume,
    scan_chunk,
    scanned_kind,
)
from attnviz.models.loading import ModelBundle


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError:
        return False
    return True


class ScanActor:
    """One model replica: scans the documents of each block it is given."""

    def __init__(self, folder: str, dtype: str, kind: str, max_tokens: int, n_layers: int, n_heads: int,
                 threads: int):
        import torch

        from attnviz.models.loading import load_model_dir
        from attnviz.system.runtime import configure_environment

        configure_environment()
        torch.set_num_threads(max(1, threads))
        self.bundle = load_model_dir(folder, dtype=dtype)
        self.kind, self.max_tokens, self.shape = kind, max_tokens, (n_layers, n_heads)

    def __call__(self, batch: dict) -> dict:
        documents = [(int(doc), Document(str(text), str(source)))
                     for doc, text, source in zip(batch["doc"], batch["text"], batch["source"], strict=True)]
        partial = scan_chunk(self.bundle, self.kind, documents, self.max_tokens, *self.shape)
        return {"partial": [pickle.dumps(partial)], "docs": [[doc for doc, _ in documents]]}


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


def run_scan_on_ray(corpus: Corpus, bundle: ModelBundle, path: str | Path, settings: ScanSettings = DEFAULT_SETTINGS,
                    *, address: str | None = "auto", workers: int = 2, threads_per_worker: int = 1,
                    dtype: str = "stored", progress: Callable[[Progress], None] | None = None,
                    should_stop: Callable[[], bool] | None = None) -> Progress:
    """:func:`attnviz.corpus.scan.runner.run_scan` on Ray: ``workers`` actors each load the model from ``bundle.folder``
    (``bundle`` on the driver gives the scan's settings). ``address``: a cluster's address, or "auto" (the local
    cluster, started if none runs)."""
    if not ray_available():
        raise ScanRefused("Ray is not installed: pip install 'ray[data]', or scan in-process (without --ray)")
    import ray
    import ray.data

    kind, n_layers, n_heads = scanned_kind(bundle)
    check_token_limit(settings, n_layers, n_heads)
    started_here = start_ray(address)
    try:
        with open_writer(path, corpus, bundle, settings, kind, n_layers, n_heads) as writer:
            todo, state, partial = resume(writer, corpus, settings, n_layers, n_heads)
            if todo:
                context = ray.data.DataContext.get_current()
                context.execution_options.preserve_order = True  # blocks arrive in corpus order: the same sums
                context.enable_progress_bars = False  # the scan reports its own progress
                gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
                blocks = ray.data.from_items(
                    [{"doc": doc, "text": document.text, "source": document.source} for doc, document in todo],
                    override_num_blocks=max(1, -(-len(todo) // settings.chunk_docs)))
                scanned = blocks.map_batches(
                    ScanActor, batch_size=settings.chunk_docs, concurrency=max(1, workers), num_gpus=gpus,
                    num_cpus=threads_per_worker,
                    fn_constructor_args=(str(bundle.folder), dtype, kind, settings.max_tokens, n_layers, n_heads,
                                         threads_per_worker))
                by_doc = dict(todo)
                for row in scanned.iter_rows():
                    part = pickle.loads(row["partial"])  # made by our own actors, never read from a user's file
                    record_chunk(writer, partial, part, {doc: by_doc[doc] for doc in row["docs"]}, state)
                    if progress is not None:
                        progress(state)
                    if should_stop is not None and should_stop():
                        state.status = store.STATUS_STOPPED
                        break
            finish(writer, state, keep_sample(writer, bundle, kind, corpus, settings, state, progress,
                                              should_stop))
        if state.status == store.STATUS_FINISHED and not state.finished_before:  # as in runner.run_scan
            store.rewrite_compactly(path)
    finally:
        if started_here:
            ray.shutdown()
    if progress is not None:
        progress(state)
    return state
