"""A corpus file's facts (how many documents, the report, the fingerprint) and columns, read in a process of its
own with a cap on its memory (address space) and CPU time, so that a file crafted to decode to far more than its
size (:mod:`attnviz.corpus.documents` bounds that too) can cost the server at most this process.

The page calls :func:`probe`; the child is ``python -m attnviz.corpus.document_probe REQUEST`` (a JSON object) and
prints one JSON line: ``{"facts": {...}}`` or ``{"refused": "why"}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from attnviz.corpus.document_files import columns_of, read_corpus
from attnviz.corpus.documents import BUNDLED, CorpusRefused, bundled_corpus
from attnviz.system.runtime import child_environment

DEFAULT_MEMORY_CAP_MB = 1536  # the child's address space (Python and pyarrow take about 330 MB of it)
CPU_SECONDS = 60  # the child's CPU time
WALL_SECONDS = 90  # and its time on the clock, waiting included
PREVIEW_CHARS = 300
_AT_ONCE = threading.BoundedSemaphore(max(1, os.cpu_count() or 1))  # readers running at once in this server


def memory_cap_bytes() -> int:
    """The child's address space (``ATTNVIZ_CORPUS_READER_MB``, 1,536)."""
    try:
        return int(max(256.0, float(os.environ.get("ATTNVIZ_CORPUS_READER_MB", DEFAULT_MEMORY_CAP_MB))) * 1024**2)
    except ValueError:
        return DEFAULT_MEMORY_CAP_MB * 1024**2


def facts_of(path: str | None, split: str = "line", field_name: str | None = None) -> dict:
    """What the page shows of a corpus and needs to name its scan, read here (in this process)."""
    corpus = bundled_corpus() if path is None else read_corpus(path, split=split, field_name=field_name, keep=1)
    return {"name": corpus.name, "documents": corpus.count, "report": corpus.report.lines(),
            "fingerprint": corpus.fingerprint, "first": corpus.documents[0].text[:PREVIEW_CHARS]
            if corpus.documents else "", "chars_every": corpus.chars_every, "characters": corpus.characters}


def probe(path: str | Path, what: str = "facts", *, split: str = "line", field_name: str | None = None) -> dict | list:
    """``what`` "facts" (:func:`facts_of`) or "columns" (:func:`attnviz.corpus.document_files.columns_of`) of the file
    at
    ``path``, read in a child process with :func:`memory_cap_bytes` and :data:`CPU_SECONDS`. Refused in words
    (:class:`CorpusRefused`) when the file is refused, or the child passes a cap."""
    request = json.dumps({"path": str(path), "what": what, "split": split, "field": field_name})
    try:
        with _AT_ONCE:  # one reader per core at most: visitors who upload at once wait their turn
            child = subprocess.run([sys.executable, "-m", "attnviz.corpus.document_probe", request],
                                   capture_output=True, text=True, timeout=WALL_SECONDS, env=child_environment(),
                                   stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CorpusRefused(f"reading the file took more than {WALL_SECONDS} s") from None
    answer = None
    for line in reversed(child.stdout.splitlines()):
        try:
            answer = json.loads(line)
            break
        except ValueError:
            continue
    if isinstance(answer, dict) and "refused" in answer:
        raise CorpusRefused(str(answer["refused"]))
    if isinstance(answer, dict) and what in answer:
        if what == "facts":
            return {**answer["facts"], "peak_bytes": answer.get("peak_bytes")}
        return answer[what]
    if child.returncode in (-9, -24) or "MemoryError" in child.stderr:  # the kernel's CPU limit, or the cap
        raise CorpusRefused(f"reading the file needs more than {memory_cap_bytes() / 1024**3:.1f} GiB of memory or "
                            f"{CPU_SECONDS} s of CPU")
    raise CorpusRefused(f"the file could not be read (the reader ended with code {child.returncode})")


def _cap() -> None:
    import resource

    cap = memory_cap_bytes()
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS + 5))


def _peak_resident_bytes() -> int | None:
    """This process's peak resident memory (Linux's VmHWM: since its start, unlike ru_maxrss, which a child keeps
    from the process that forked it); None where /proc does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def main(argv: list[str]) -> int:
    _cap()
    request = json.loads(argv[0])
    path = None if request["path"] == BUNDLED else request["path"]
    try:
        if request["what"] == "columns":
            answer = {"columns": columns_of(path)}
        else:
            answer = {"facts": facts_of(path, request.get("split") or "line", request.get("field"))}
    except CorpusRefused as problem:
        answer = {"refused": str(problem)}
    except MemoryError:
        answer = {"refused": f"reading the file needs more than {memory_cap_bytes() / 1024**3:.1f} GiB of memory"}
    except OSError as problem:
        answer = {"refused": f"the file cannot be read ({problem.strerror or type(problem).__name__})"}
    answer["peak_bytes"] = _peak_resident_bytes()
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
