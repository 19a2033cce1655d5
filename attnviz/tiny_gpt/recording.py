"""The bundled tiny GPT's own run, kept: its measures at log-spaced steps and a few snapshots around the moment its
induction heads form.

While :mod:`attnviz.tiny_gpt.train` trains, :class:`Recorder` measures the model
(:func:`attnviz.interventions.training_measures.measure`) before the first step and after each of about 45 steps
spaced evenly on a log scale, and keeps each measured state in float16 in memory. After the run it finds the phase
change (:func:`attnviz.interventions.training_measures.phase_change`) and writes, beside the model, ``over-training/``:
``measures.json`` (every measured step) and one folder per kept snapshot (``step-01234/``, a whole checkpoint in
float16 that loads like any other): the last measured step before the change, the one nearest its middle, and the
first after it. The trained model itself is the run's last step.

Imports torch, transformers and attnviz.interventions.training_measures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from attnviz.core.schedule import log_spaced_steps
from attnviz.interventions import training_measures as tm
from attnviz.interventions.training_runs import MEASURES_FILE, SERIES_DIR, snapshot_name

MEASURED = 44  # log-spaced steps measured, besides step 0
FIRST_MEASURED = 4  # the first of them (steps 1-3 change little and would crowd the log axis)


def measured_steps(steps: int, count: int = MEASURED) -> list[int]:
    """Step 0 and ``count`` steps from :data:`FIRST_MEASURED` to ``steps`` evenly spaced on a log scale (rounded,
    repeats dropped): a step ``s`` is the model after ``s`` optimiser steps."""
    if steps <= FIRST_MEASURED:
        return list(range(steps + 1))
    return log_spaced_steps(steps, count, FIRST_MEASURED)


class Recorder:
    """Call it with ``(steps done, model)`` after every step (and once with 0 before the first): it measures and
    keeps the model at :func:`measured_steps`."""

    def __init__(self, probe: tm.Probe, steps: int, log=print):
        self.probe = probe
        self.steps = set(measured_steps(steps))
        self.rows: list[dict] = []
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        self.log = log

    def __call__(self, done: int, model: torch.nn.Module) -> None:
        if done not in self.steps:
            return
        row = {"step": done, **tm.measure(model, self.probe)}
        self.rows.append(row)
        self.states[done] = {name: value.detach().to(torch.float16, copy=True) if value.is_floating_point()
                             else value.detach().clone() for name, value in model.state_dict().items()}
        best = max(max(layer) for layer in row["induction"])
        self.log(f"measured step {done:5d}: held-out loss {row['loss']:.3f}, in-context {row['icl']:+.3f}, best "
                 f"induction score {best:.3f}")

    def save(self, out: Path, model: torch.nn.Module, tokenizer, extra: dict) -> dict:
        """Write ``out/over-training/``: the measures (with ``extra``: the probe's and the run's facts) and the
        snapshots before, during and after the phase change. Returns what ``measures.json`` holds."""
        folder = out / SERIES_DIR
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        change = tm.phase_change([row["step"] for row in self.rows], [row["induction"] for row in self.rows])
        kept = sorted({step for step in (change.before, change.middle, change.after) if step is not None}
                      - {self.rows[-1]["step"]}) if change else []
        for step in kept:
            snapshot = type(model)(model.config)
            snapshot.load_state_dict({name: value.float() if value.is_floating_point() else value
                                      for name, value in self.states[step].items()})
            snapshot.half().save_pretrained(folder / snapshot_name(step), safe_serialization=True)
            tokenizer.save_pretrained(folder / snapshot_name(step))
        written = {**extra, "rule": tm.PHASE_RULE, "phase_change": change.as_dict() if change else None,
                   "snapshots": kept, "rows": self.rows}
        (folder / MEASURES_FILE).write_text(json.dumps(written, indent=1) + "\n")
        return written
