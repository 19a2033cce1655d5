"""A corpus importance run on a Ray cluster: the documents as Ray Data blocks through a pool of actors, each holding
one replica of the model (one GPU each where the cluster has GPUs) and measuring each block as
:func:`attnviz.corpus.importance.runner.measure_chunk` does in-process; the driver computes the corpus means first and
commits each block's rows like an in-process chunk, so the database is the same either way and a run stopped on Ray
resumes in-process or on Ray alike.

Ray is an optional extra (``pip install "ray[data]"``; the README's test setup installs it).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

from attnviz.corpus.documents import Corpus, Document
from attnviz.corpus.importance.runner import (
    DEFAULT_SETTINGS,
    ImportanceProgress,
    ImportanceSettings,
    Stopped,
    measure_chunk,
    run_importance,
)
from attnviz.corpus.scan.on_ray import ray_available, start_ray
from attnviz.corpus.scan.runner import ScanRefused


class ImportanceActor:
    """One model replica: measures the documents of each block it is given."""

    def __init__(self, folder: str, dtype: str, objective: str, settings: ImportanceSettings, means, threads: int):
        import torch

        from attnviz.interventions import importance as imp
        from attnviz.interventions.edits import attention_modules, editable_checkpoint
        from attnviz.system.runtime import configure_environment

        configure_environment()
        torch.set_num_threads(max(1, threads))
        self.model, self.tokenizer, _ = editable_checkpoint(folder, dtype)
        self.objective, self.settings, self.means = objective, settings, means
        probe = imp.batch_of(self.tokenizer, ["a b"], objective, settings.max_tokens)
        self.modules = attention_modules(self.model, probe.inputs)

    def __call__(self, batch: dict) -> dict:
        documents = [(int(doc), Document(str(text), str(source)))
                     for doc, text, source in zip(batch["doc"], batch["text"], batch["source"], strict=True)]
        rows, effects = measure_chunk(self.model, self.tokenizer, self.objective, self.modules, documents,
                                      self.settings, self.means)
        return {"rows": [pickle.dumps(rows)], "effects": [pickle.dumps(effects)]}


def run_importance_on_ray(corpus: Corpus, folder: str | Path, path: str | Path,
                          settings: ImportanceSettings = DEFAULT_SETTINGS, *, name: str | None = None,
                          dtype: str = "stored", address: str | None = "auto", workers: int = 2,
                          threads_per_worker: int = 1, loaded: tuple | None = None, source: str | None = None,
                          progress: Callable[[ImportanceProgress], None] | None = None,
                          should_stop: Callable[[], bool] | None = None) -> ImportanceProgress:
    """:func:`attnviz.corpus.importance.runner.run_importance` with the heads' pass on Ray: ``workers`` actors each
    load the checkpoint from ``folder``. ``address``: a cluster's address, or "auto" (the local cluster, started if
    none runs)."""
    if not ray_available():
        raise ScanRefused("Ray is not installed: pip install 'ray[data]', or run in-process (without --ray)")
    import ray
    import ray.data

    def measure(model, tokenizer, objective, modules, todo, settings, means, should_stop):
        if not todo:
            return
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True  # blocks arrive in corpus order
        context.enable_progress_bars = False  # the run reports its own progress
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        blocks = ray.data.from_items(
            [{"doc": doc, "text": document.text, "source": document.source} for doc, document in todo],
            override_num_blocks=max(1, -(-len(todo) // settings.chunk_docs)))
        measured = blocks.map_batches(
            ImportanceActor, batch_size=settings.chunk_docs, concurrency=max(1, workers), num_gpus=gpus,
            num_cpus=threads_per_worker,
            fn_constructor_args=(str(folder), dtype, objective, settings, means, threads_per_worker))
        for row in measured.iter_rows():
            # made by our own actors, never read from a user's file
            yield pickle.loads(row["rows"]), pickle.loads(row["effects"])
            if should_stop is not None and should_stop():
                raise Stopped

    started_here = start_ray(address)
    try:
        return run_importance(corpus, folder, path, settings, name=name, dtype=dtype, loaded=loaded, source=source,
                              progress=progress, should_stop=should_stop, measure=measure)
    finally:
        if started_here:
            ray.shutdown()
