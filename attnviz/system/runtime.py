"""The process environment attnviz needs, set in one place, and what this installation can do (optional
dependencies and the features that need them).

Call :func:`configure_environment` at process start (``app.py``, the tests and the benchmarks do), before
anything imports transformers or triton.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path


def configure_environment() -> None:
    """Everything offline (never reach for a model hub), and Triton's interpreter when there is no GPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    configure_triton()


def child_environment() -> dict[str, str]:
    """The environment of a process attnviz starts with ``python -m attnviz....`` (a scan, a corpus reader): this
    one's, with the package on the path, so that it runs from any folder."""
    package = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([package, *filter(None, [os.environ.get("PYTHONPATH")])])}


def configure_triton() -> None:
    """Without a GPU, Triton kernels can only run in its interpreter, and Triton decides that when it is first
    imported (its standard library is decorated then). transformers imports triton while loading a model, so this
    must run at process start, before any model is loaded."""
    if "triton" in sys.modules:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


@dataclass(frozen=True)
class OptionalFeature:
    package: str
    available: bool
    version: str | None
    needed_for: str


OPTIONAL_PACKAGES = {
    "triton": "the Triton flash-attention kernel (on an NVIDIA GPU, or the CPU interpreter for small inputs)",
}


def optional_features() -> list[OptionalFeature]:
    """Each optional package, whether it imports here, and what it is needed for."""
    features = []
    for package, needed_for in OPTIONAL_PACKAGES.items():
        try:
            module = importlib.import_module(package)
            features.append(OptionalFeature(package, True, getattr(module, "__version__", None), needed_for))
        except Exception:  # noqa: BLE001 - a broken install is as unavailable as a missing one
            features.append(OptionalFeature(package, False, None, needed_for))
    return features
