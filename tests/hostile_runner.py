"""The child process of the hostile-input suite: ``python -m tests.hostile_runner PLAN FIRST LAST``.

Runs cases FIRST..LAST of the plan (:mod:`tests.hostile_checkpoints`) one after another, under a memory cap, and
prints one ``HOSTILE-START name`` line before each case and one ``HOSTILE-RESULT {json}`` line after it. The
parent enforces the time limit (a case that hangs never prints its result; the parent kills this process).

Each case is fed to what the Checkpoints page calls: ``prepare_zip`` / ``prepare_single_files`` /
``prepare_folder_path``, then ``load_model_dir``, in a thread, while the main thread loads a small model beside
it. What is recorded:

- how it ended: refused (:class:`CheckpointRefused`, with the message), loaded, or crashed (any other exception);
- whether anything was unpickled: ``torch.load`` and ``pickle``'s loaders are replaced by recorders first;
- whether anything outside the upload was read: Python's ``open`` audit events under the sentinel folder, and
  the sentinel's values in the loaded weights or its token in the loaded vocabulary (Rust readers open files
  outside Python's audit hooks, so the values are checked too);
- whether the hostile load ever took the process-wide ``LOADING`` lock, and how long the small model took.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import resource
import shutil
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

MEMORY_CAP = 6 * 1024**3  # address space: torch and transformers reserve ~1 GB; /dev/zero would take it all


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


UNPICKLED: list[str] = []
OPENED: list[str] = []


def _record_unpickling() -> None:
    import torch

    def refuse(name):
        def recorder(*args, **kwargs):
            UNPICKLED.append(name)
            raise RuntimeError(f"{name} was called: something tried to unpickle")
        return recorder

    torch.load = refuse("torch.load")
    torch.serialization.load = refuse("torch.serialization.load")
    pickle.load = refuse("pickle.load")
    pickle.loads = refuse("pickle.loads")

    class Unpickler(pickle.Unpickler):
        def __init__(self, *args, **kwargs):
            UNPICKLED.append("pickle.Unpickler")
            raise RuntimeError("pickle.Unpickler was made: something tried to unpickle")

    pickle.Unpickler = Unpickler


def _watch_opens(secret: str) -> None:
    def hook(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if os.path.realpath(path).startswith(secret):
                OPENED.append(path)

    sys.addaudithook(hook)


def _prepare(case: dict):
    from attnviz.checkpoints.uploads import prepare_folder_path, prepare_single_files, prepare_zip

    if case["kind"] == "zip":
        path = Path(case["path"])
        with open(path, "rb") as upload:
            return prepare_zip(upload, path.name)
    if case["kind"] == "files":
        folder = Path(case["path"])
        names = json.loads((folder / "files.json").read_text())
        return prepare_single_files([(name, (folder / str(i)).read_bytes()) for i, name in enumerate(names)])
    return prepare_folder_path(case["path"])


def _leaked(bundle, facts: dict) -> list[str]:
    found = []
    for name, parameter in bundle.model.named_parameters():
        if parameter.numel() and bool((parameter.float() == facts["sentinel_value"]).any()):
            found.append(f"the sentinel's weights in {name}")
            break
    tokenizer = bundle.tokenizer
    if tokenizer is not None and hasattr(tokenizer, "get_vocab") and facts["sentinel_token"] in tokenizer.get_vocab():
        found.append("the sentinel's token in the vocabulary")
    return found


def run_case(case: dict, facts: dict) -> dict:
    import torch

    from attnviz.checkpoints.safety import CheckpointRefused
    from attnviz.models import loading, with_heads
    from attnviz.models.capture import capture
    from attnviz.models.replay_check import replay_difference

    if case["model_root"]:
        os.environ["ATTNVIZ_MODEL_ROOT"] = case["model_root"]
    else:
        os.environ.pop("ATTNVIZ_MODEL_ROOT", None)
    UNPICKLED.clear()
    OPENED.clear()
    result = {"case": case["name"], "notes": [], "locked_by_hostile": False}
    hostile_thread: list[int] = []
    original_lock = loading.loading_lock

    def watched_lock(progress=None):
        if threading.get_ident() in hostile_thread:
            result["locked_by_hostile"] = True
        return original_lock(progress)

    loading.loading_lock = watched_lock

    def attempt():
        hostile_thread.append(threading.get_ident())
        started = time.perf_counter()
        folder = None
        try:
            folder, owned, notes = _prepare(case)
            result["notes"] += notes
            result["absent_present"] = [name for name in case["absent"] if (folder / name).exists()]
            if case["causal"] or case["masked"]:  # a model with its LM head (Generation, head importance)
                load = with_heads.load_masked_lm if case["masked"] else with_heads.load_causal_lm
                model, tokenizer = load(folder)
                result.update(seconds=time.perf_counter() - started, outcome="loaded", notes=result["notes"],
                              fallback_tokenizer=False, replay_finite=True,
                              leaked=_leaked(SimpleNamespace(model=model, tokenizer=tokenizer), facts))
                return
            bundle = loading.load_model_dir(folder)
            result["seconds"] = time.perf_counter() - started
            result["outcome"] = "loaded"
            result["notes"] += bundle.notes + ([bundle.tokenizer_note] if bundle.tokenizer_note else [])
            result["fallback_tokenizer"] = bundle.uses_fallback_tokenizer
            result["leaked"] = _leaked(bundle, facts)
            if case["image"]:
                from attnviz.core import vision
                from attnviz.models.capture import capture_image

                captured = capture_image(bundle, vision.test_image())
                result["replay_finite"] = math.isfinite(replay_difference(captured.records["self"]))
            elif case["nonfinite"]:
                captured = capture(bundle, "The cat sat on the mat.")
                result["capture_nonfinite"] = captured.nonfinite
                result["replay"] = repr(replay_difference(captured.records["self"]))
                result["load_nonfinite"] = bundle.nonfinite_outputs
            else:
                captured = capture(bundle, "The cat sat on the mat.")
                result["replay_finite"] = math.isfinite(replay_difference(captured.records["self"]))
        except CheckpointRefused as refused:
            result["seconds"] = time.perf_counter() - started
            result["outcome"] = "refused"
            result["message"] = str(refused)
        except BaseException as problem:  # noqa: BLE001 - anything else is a crash: what the suite exists to catch
            result["seconds"] = time.perf_counter() - started
            result["outcome"] = "crashed"
            result["message"] = f"{type(problem).__name__}: {str(problem)[:300]}"
        finally:
            if folder is not None and case["kind"] != "folder":
                shutil.rmtree(folder.parent, ignore_errors=True)  # the upload's workspace, as the page removes it

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    while not hostile_thread:
        time.sleep(0.001)
    started = time.perf_counter()
    small = loading.load_model_dir(facts["small"])
    result["small_seconds"] = time.perf_counter() - started
    assert torch.is_tensor(next(small.model.parameters()))
    thread.join()
    loading.loading_lock = original_lock
    result["unpickled"] = list(UNPICKLED)
    result["opened_outside"] = list(OPENED)
    result["marker"] = os.path.exists(facts["marker"])
    return result


def main() -> None:
    plan_path, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    _cap_memory()
    plan = json.loads(Path(plan_path).read_text())
    facts = plan["facts"]
    from attnviz.system.runtime import configure_environment

    configure_environment()
    import attnviz.models.loading  # noqa: F401 - imported before the recorders, as the server imports it

    _record_unpickling()
    _watch_opens(os.path.realpath(facts["secret"]))
    for case in plan["cases"][first:last]:
        print("HOSTILE-START", case["name"], flush=True)
        print("HOSTILE-RESULT", json.dumps(run_case(case, facts)), flush=True)


if __name__ == "__main__":
    main()
