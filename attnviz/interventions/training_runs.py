"""A training run as the "Over training" page draws it: the measures of
:mod:`attnviz.interventions.training_measures` at each measured step, the phase change where the data puts it, and
the checkpoints that can be opened, by step. Two sources give one: the bundled tiny GPT's own run (its
``over-training/measures.json`` and snapshots, written by :mod:`attnviz.tiny_gpt.recording`), and a series of a
user's checkpoints measured in the background.

Imports attnviz.interventions.training_measures and attnviz.models.shipped."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from attnviz.interventions import training_measures as tm
from attnviz.models.shipped import BUNDLED_GPT_DIR

SERIES_DIR = "over-training"  # beside the bundled model: measures.json and step-NNNNN/ snapshots
MEASURES_FILE = "measures.json"


def snapshot_name(step: int) -> str:
    """The folder of the snapshot at ``step``: ``step-01234``."""
    return f"step-{step:05d}"


@dataclass
class Run:
    """One run's measures at its measured steps, ascending (each row: ``step`` and every key
    :func:`attnviz.interventions.training_measures.measure` returns), the phase change (None: the rule marks none),
    and the folders that open as checkpoints, by step."""

    name: str
    rows: list[dict]
    phase: tm.PhaseChange | None
    checkpoints: dict[int, Path] = field(default_factory=dict)
    facts: dict = field(default_factory=dict)  # how the run and its measures were made (seconds, threads, ...)

    @property
    def steps(self) -> list[int]:
        return [row["step"] for row in self.rows]

    def nearest_checkpoint(self, step: int) -> int | None:
        """The step of the checkpoint nearest to ``step`` (on a log scale: step 100 is nearer 50 than 200), or None
        when the run keeps none."""
        if not self.checkpoints:
            return None
        import math

        return min(self.checkpoints, key=lambda kept: (abs(math.log1p(kept) - math.log1p(step)), kept))


def bundled_run(folder: Path = BUNDLED_GPT_DIR) -> Run | None:
    """The bundled tiny GPT's own run (None when its folder has no ``over-training/measures.json``): its snapshots
    and, at the last step, the model itself."""
    measures = folder / SERIES_DIR / MEASURES_FILE
    if not measures.is_file():
        return None
    written = json.loads(measures.read_text())
    rows = written["rows"]
    checkpoints = {step: folder / SERIES_DIR / snapshot_name(step) for step in written["snapshots"]}
    checkpoints[rows[-1]["step"]] = folder
    facts = {key: value for key, value in written.items() if key not in ("rows", "phase_change", "snapshots")}
    return Run("the bundled tiny GPT's own run", rows,
               tm.phase_change([row["step"] for row in rows], [row["induction"] for row in rows]), checkpoints, facts)
