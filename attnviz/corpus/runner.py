"""The one runner both corpus runs (a scan, an importance run) go through: the documents left to do, in chunks,
each chunk measured, then recorded in the run's database in one transaction and reported, until every chunk is
done or a stop is asked (:class:`Stopped`), so that any run resumes from its last committed chunk.

Where a chunk is measured is a strategy (:data:`Measure`): :func:`measure_here`, in this process one chunk after
the other, or :func:`attnviz.corpus.on_ray.on_ray`, on a Ray cluster. A run describes its chunk's measure once, as a
:class:`ChunkWork` that either strategy can run, so that a run gives the same database whichever ran its chunks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from attnviz.corpus.documents import Document
from attnviz.corpus.scan.store import STATUS_RUNNING

Documents = list[tuple[int, Document]]  # (doc number in the corpus, document)
StopAsked = Callable[[], bool] | None
Writer = TypeVar("Writer")


class Stopped(Exception):
    """Asked to stop: the chunk being measured is dropped, and the run resumes from it."""


@dataclass
class Progress:
    done: int  # documents done, this run and before
    planned: int
    started: float  # this run's start (time.time())
    done_this_run: int = 0
    tokens_this_run: int = 0
    status: str = STATUS_RUNNING
    sampled: int = 0  # documents whose queries and keys were kept, of sample_planned (after every document)
    sample_planned: int = 0
    finished_before: bool = False  # the run was finished when this one began: nothing to do, group or copy

    @property
    def elapsed(self) -> float:
        return max(time.time() - self.started, 1e-9)

    @property
    def documents_per_second(self) -> float:
        return self.done_this_run / self.elapsed

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_this_run / self.elapsed

    @property
    def eta(self) -> float | None:
        rate = self.documents_per_second
        return (self.planned - self.done) / rate if rate > 0 else None

    def as_dict(self) -> dict:
        return {**asdict(self), "documents_per_second": self.documents_per_second,
                "tokens_per_second": self.tokens_per_second, "eta": self.eta, "updated": time.time()}


@dataclass(frozen=True)
class ChunkWork:
    """What a run does with one chunk of documents, for either strategy: ``here``, in this process (with the model
    already loaded and whatever the run keeps between chunks); ``replica``, a picklable recipe that builds the same
    measure in another process (a Ray actor loads its own replica of the model). Chunks of ``chunk_docs``
    documents: what a stop may lose."""

    here: Callable[[Documents], object]
    replica: Callable[[], Callable[[Documents], object]]
    chunk_docs: int


# A strategy: (work, the documents left, the stop asked) -> each chunk with what was measured of it, in order.
Measure = Callable[[ChunkWork, Documents, StopAsked], Iterator[tuple[Documents, object]]]


def chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def measure_here(work: ChunkWork, todo: Documents, should_stop: StopAsked) -> Iterator[tuple[Documents, object]]:
    """The chunks measured in this process, one after the other; a stop is asked before each chunk."""
    for chunk in chunks(todo, work.chunk_docs):
        if should_stop is not None and should_stop():
            raise Stopped
        yield chunk, work.here(chunk)


def run_chunks(work: ChunkWork, todo: Documents, record: Callable[[Documents, object], None], state: Progress, *,
               measure: Measure | None = None, progress: Callable | None = None,
               should_stop: StopAsked = None) -> None:
    """Every chunk of ``todo`` measured by ``measure`` (default :func:`measure_here`), then ``record``-ed and
    reported. Raises :class:`Stopped` when a stop is asked; the strategy is closed either way (a Ray cluster it
    started is shut down)."""
    with contextlib.closing((measure or measure_here)(work, todo, should_stop)) as measured:
        for documents, result in measured:
            record(documents, result)
            report(progress, state)


def report(progress: Callable | None, state: Progress) -> None:
    if progress is not None:
        progress(state)


def pending(planned: Documents, done: set[int]) -> Documents:
    """The planned documents not yet in the database: what a resumed run has left."""
    return [(doc, document) for doc, document in planned if doc not in done]


def open_results(open_writer: Callable[[Path], Writer], path: str | Path, key: str, what: str,
                 refused: type[Exception]) -> tuple[Writer, bool]:
    """The database at ``path`` opened by ``open_writer``, and whether it is new (its settings are to be written);
    resumed when it holds the run ``key``. Refused (``refused``, the run's own refusal) when it holds another ``what``
    (another corpus, model or limits): a run never adds to another's results."""
    writer = open_writer(Path(path))
    existing = writer.settings()
    if existing and existing.get("key") != key:
        writer.close()
        raise refused(f"{Path(path).name} holds another {what} (another corpus, model or limits): choose a new "
                      "file, or delete it")
    return writer, not existing
