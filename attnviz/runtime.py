"""What this installation can do: optional dependencies and the features that need them."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


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
