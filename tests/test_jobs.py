"""The server's queue of background jobs (attnviz.corpus.jobs): a server-wide limit, places in the queue, one job per
browser and per session, an atomic start, jobs ended with their owner's folder, disk reserved while they run; and a
crowd of cookie-less sessions asking for scans on the page at once."""

import sys
import threading
import time
from pathlib import Path

import pytest

from attnviz.checkpoints import disk
from attnviz.corpus import jobs
from attnviz.corpus.jobs import JobQueue, JobRefused


def sleeper(marker: Path, seconds: float = 0.5) -> list[str]:
    """A job that takes ``seconds`` and leaves ``marker`` when it has run to its end."""
    return [sys.executable, "-c", f"import time, pathlib; time.sleep({seconds}); pathlib.Path({str(marker)!r}).touch()"]


def submit(queue: JobQueue, folder: Path, marker: Path, seconds: float = 0.5, owner: str | None = None,
           session: str | None = None, reserve=None):
    folder.mkdir(parents=True, exist_ok=True)
    return queue.submit(folder=folder, key=folder.name, kind="scan", command=sleeper(marker, seconds),
                        log=folder / "job.log", owner=owner or str(folder), session=session, reserve=reserve)


def wait_until(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_at_most_the_limit_run_the_rest_wait_in_order_and_all_run(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_JOBS", "1")
    queue = JobQueue(tmp_path / "queue")
    folders = [tmp_path / f"browser{i}" for i in range(3)]
    started = [submit(queue, folder, tmp_path / f"done{i}", seconds=1.0) for i, folder in enumerate(folders)]
    assert [(job.state, job.place) for job in started] == [("running", 0), ("waiting", 1), ("waiting", 2)]
    assert started[1].running == 1 and started[1].limit == 1
    seen_running = set()

    def all_done() -> bool:
        queue.tick()
        running, _ = queue.counts()
        assert running <= 1
        for folder in folders:
            job = queue.job_of(folder)
            if job is not None and job.state == jobs.RUNNING:
                seen_running.add(folder.name)
        return all((tmp_path / f"done{i}").exists() for i in range(3)) and queue.counts() == (0, 0)

    wait_until(all_done)
    assert seen_running == {"browser0", "browser1", "browser2"}  # nothing lost: each ran, one at a time


def test_one_job_per_browser_and_per_session(tmp_path):
    queue = JobQueue(tmp_path / "queue")
    submit(queue, tmp_path / "a" / "scans", tmp_path / "x", seconds=5, owner="browser-a", session="s1")
    with pytest.raises(JobRefused, match="of this browser is running already"):  # its importance run, say
        submit(queue, tmp_path / "a" / "importance", tmp_path / "y", owner="browser-a", session="s2")
    with pytest.raises(JobRefused, match="one job at a time"):  # a new cookie in the same session
        submit(queue, tmp_path / "b", tmp_path / "z", owner="browser-b", session="s1")
    queue.end_under(tmp_path)


def test_a_full_queue_refuses_with_the_numbers(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_JOBS", "1")
    monkeypatch.setenv("ATTNVIZ_JOBS_WAITING", "2")
    queue = JobQueue(tmp_path / "queue")
    for i in range(3):
        submit(queue, tmp_path / f"b{i}", tmp_path / f"m{i}", seconds=5)
    with pytest.raises(JobRefused, match="this server runs 1 job and 2 wait, the most it queues"):
        submit(queue, tmp_path / "b3", tmp_path / "m3")
    assert queue.end_under(tmp_path) == 3 and queue.counts() == (0, 0)


def test_sessions_asking_at_once_cannot_pass_the_limits_together(tmp_path, monkeypatch):
    """The check and the queueing happen under one lock: 12 threads at once, 1 may run and 3 wait."""
    monkeypatch.setenv("ATTNVIZ_JOBS", "1")
    monkeypatch.setenv("ATTNVIZ_JOBS_WAITING", "3")
    queue = JobQueue(tmp_path / "queue")
    outcomes = []
    barrier = threading.Barrier(12)

    def ask(i: int) -> None:
        barrier.wait()
        try:
            outcomes.append(submit(queue, tmp_path / f"b{i}", tmp_path / f"m{i}", seconds=5).state)
        except JobRefused:
            outcomes.append("refused")

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused"] * 8 + ["running"] + ["waiting"] * 3
    assert queue.end_under(tmp_path) == 4


def test_jobs_end_with_their_folder_and_release_their_disk(tmp_path, monkeypatch):
    """A browser's store expiring (or a session's folder going) ends its jobs: a running one is killed, a waiting
    one leaves the queue; either way its disk reservation is released. A running job holds its own reservation
    (named by its process), so it outlives a restart of the server, never its job."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # an uploads root (and reservations) of this test's own
    monkeypatch.setenv("ATTNVIZ_JOBS", "1")
    queue = JobQueue(tmp_path / "queue")

    def reserve(folder):
        return lambda: str(disk.reserve(folder, 1024, part="nothing-written").entry)

    def holders() -> list[int]:
        return sorted(int(entry.name.split("-")[0]) for entry, _, _ in disk._entries(disk.uploads_root()))

    running = submit(queue, tmp_path / "gone" / "scans", tmp_path / "never", seconds=30,
                     reserve=reserve(tmp_path / "gone" / "scans"))
    waiting = submit(queue, tmp_path / "stays", tmp_path / "later", seconds=0.1, reserve=reserve(tmp_path / "stays"))
    assert (running.state, waiting.state) == ("running", "waiting")
    import os

    assert holders() == sorted([running.pid, os.getpid()])  # the running job's, and the waiting one's (by the server)
    # what the janitor does before it deletes an expired browser's folder
    assert queue.end_under(tmp_path / "gone") == 1
    wait_until(lambda: not jobs._alive(running.pid, None))
    wait_until(lambda: (tmp_path / "later").exists())  # the waiting job ran once there was room
    wait_until(lambda: queue.counts() == (0, 0))  # and, once its process ended, left the queue
    assert holders() == []
    # a job whose folder vanished without a word (a session's folder deleted) is ended on the next look
    job = submit(queue, tmp_path / "vanishing", tmp_path / "never2", seconds=30)
    import shutil

    shutil.rmtree(tmp_path / "vanishing")
    queue.tick()
    assert queue.counts() == (0, 0)
    wait_until(lambda: not jobs._alive(job.pid, None))
    assert not (tmp_path / "never2").exists()


def test_a_waiting_job_can_leave_the_queue(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_JOBS", "1")
    queue = JobQueue(tmp_path / "queue")
    submit(queue, tmp_path / "a", tmp_path / "ma", seconds=5)
    submit(queue, tmp_path / "b", tmp_path / "mb", seconds=0.1)
    assert queue.cancel(tmp_path / "b", "b") and queue.job_of(tmp_path / "b") is None
    assert not queue.cancel(tmp_path / "a", "a")  # a running job is asked to stop instead
    queue.end_under(tmp_path)


@pytest.mark.slow
@pytest.mark.serial
def test_a_crowd_of_cookieless_sessions_asking_for_scans(bert, monkeypatch, tmp_path, clean_streamlit_caches):
    """Three sessions without cookies (each a new browser to the server) press Scan at once with ATTNVIZ_JOBS=1:
    one scan runs, the others wait with their place shown, and every scan finishes."""
    from attnviz.corpus.scan import store
    from tests.apptest_helpers import open_page

    monkeypatch.setenv("ATTNVIZ_JOBS", "1")
    # a queue of this server's own: a browser test's `streamlit run` started from this process shares the folder it
    # inherits, and moves it on under its own limit
    monkeypatch.setenv("ATTNVIZ_JOBS_DIR", str(tmp_path / "queue"))
    sessions = []
    for documents in (2, 3, 4):  # different limits: three different scans
        at = open_page("app_pages/corpus.py")
        at.number_input(key="corpus_docs").set_value(documents)
        at.number_input(key="corpus_tokens").set_value(16)
        at.number_input(key="corpus_qk_points").set_value(0)
        at.run()
        at.button(key="corpus_scan").click().run()
        assert not at.exception, [e.value for e in at.exception]
        sessions.append(at)
    texts = [" ".join(p.proto.text for p in at.get("progress")) for at in sessions]
    assert sum("Scanning" in t or "Starting the scan" in t for t in texts) == 1, texts
    assert sum("Waiting for its turn" in t for t in texts) == 2, texts
    assert any("next in the server's queue (1 of 1 job running" in t for t in texts), texts
    deadline = time.monotonic() + 300
    finished = set()
    while len(finished) < 3:
        assert time.monotonic() < deadline, "the scans did not all finish"
        running, _ = jobs.server_queue().counts()
        assert running <= 1
        for index, at in enumerate(sessions):
            at.run()
            assert not at.exception, [e.value for e in at.exception]
            chosen = at.session_state["corpus_chosen"] if "corpus_chosen" in at.session_state else None
            if not at.get("progress") and chosen and Path(chosen).is_file():
                finished.add(index)
        time.sleep(1)
    for documents, at in zip((2, 3, 4), sessions, strict=True):
        with store.ScanReader(at.session_state["corpus_chosen"]) as reader:
            assert reader.settings["status"] == store.STATUS_FINISHED and reader.documents == documents


def test_a_refused_start_never_starts_a_job_twice(tmp_path, monkeypatch):
    """A refusal that comes after the queue moved on (a double click just as the job before ends) still records what
    moved: the waiting job runs once, tracked, never twice. And a refused start leaves its job's files alone."""
    monkeypatch.setenv("ATTNVIZ_JOBS", "1")
    queue = JobQueue(tmp_path / "queue")
    starts = tmp_path / "starts"

    def counting(folder: Path) -> list[str]:
        return [sys.executable, "-c", f"import time; open({str(starts)!r}, 'a').write('x'); time.sleep(1.5)"]

    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
    queue.submit(folder=first, key="a", kind="scan", command=counting(first), log=first / "log", owner="A")
    queue.submit(folder=second, key="b", kind="scan", command=counting(second), log=second / "log", owner="B")
    (second / "b.stop").touch()  # a Stop asked of the waiting job's scan: a refused start must not drop it
    wait_until(lambda: queue.job_of(second).state == jobs.RUNNING, seconds=30)
    with pytest.raises(JobRefused):
        queue.submit(folder=second, key="b", kind="scan", command=counting(second), log=second / "log", owner="B")
    queue.tick()
    wait_until(lambda: queue.counts() == (0, 0), seconds=30)
    assert starts.read_text() == "xx"  # each job started once


def test_the_refusal_of_a_folder_job_leaves_its_files_and_a_corpus_named_like_a_scan_is_not_its_output(
        tmp_path, monkeypatch):
    from attnviz.corpus.background import ScanFolder
    from attnviz.corpus.scan.runner import ScanSettings

    monkeypatch.setenv("ATTNVIZ_JOBS", "1")
    queue = JobQueue(tmp_path / "queue")
    submit(queue, tmp_path / "other", tmp_path / "m", seconds=30)  # the one slot, taken by another browser
    folder = ScanFolder(tmp_path / "scans", queue=queue)
    settings = ScanSettings(max_docs=1, max_tokens=8, qk_points=0)
    assert folder.start("k", "bundled", "/nowhere", settings).waiting
    folder.stop_file("k").touch()
    folder.progress_file("k").write_text('{"done": 3}')
    with pytest.raises(JobRefused):  # a second tab of the browser asks again
        folder.start("k", "bundled", "/nowhere", settings)
    assert folder.stop_file("k").exists() and folder.progress("k") == {"done": 3}  # its files left alone
    queue.end_under(tmp_path)
    for leftover in folder.folder.iterdir():
        leftover.unlink()
    (folder.folder / "k.duckdb").write_bytes(b"x" * 10)
    (folder.folder / ".k.compact.duckdb").write_bytes(b"x" * 100)
    (folder.folder / "k-3f2a.txt").write_bytes(b"x" * 1000)  # an uploaded corpus whose name starts like the key
    assert disk.written_bytes(folder.folder, "k") == 110
