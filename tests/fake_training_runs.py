"""Training runs made in the tests, laid out as the bundled tiny GPT's own run is (``over-training/measures.json`` and
snapshot folders beside a model): the rows are real :func:`attnviz.interventions.training_measures.measure` rows of
tiny random GPT-2s at a few "steps" (one seed per step), with a rise planted in two heads' scores (random models
learn nothing, and the page must find a phase change where the rows put one)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from attnviz.interventions import training_measures as tm
from attnviz.interventions.training_runs import MEASURES_FILE, SERIES_DIR, snapshot_name
from attnviz.models.shipped import BUNDLED_GPT_DIR

STEPS = [0, 10, 100, 400, 1000]
SNAPSHOTS = [100, 400]  # kept as folders; the last step is the model itself
LAYERS, HEADS = 2, 2
INDUCTION_HEAD = (1, 1)
INDUCTION = [0.02, 0.03, 0.02, 0.7, 0.72]  # planted: from 0.02 at step 100 to 0.7 at step 400
PREVIOUS_TOKEN_HEAD = (0, 0)
PREVIOUS_TOKEN = [0.05, 0.2, 0.6, 0.8, 0.9]  # planted: over 0.5 from step 100
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def tiny_gpt(seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=4096, n_positions=256, n_embd=32, n_layer=LAYERS, n_head=HEADS, bos_token_id=0,
                        eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


def save(model, folder: Path, *, half: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (model.half() if half else model).save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:  # the bundled tiny GPT's tokenizer: 4,096 tokens, BOS 0
        shutil.copy(BUNDLED_GPT_DIR / name, folder / name)
    return folder


def measured_rows(steps=STEPS) -> list[dict]:
    """Real measures of a random tiny GPT-2 per step (seeded by the step), the planted rises written over them."""
    generator = torch.Generator().manual_seed(0)
    held_out = torch.randint(1, 4096, (400,), generator=generator)
    probe = tm.make_probe(held_out, list(range(1, 4096)), bos=0, windows=4, period=16, sequences=2)
    rows = []
    for index, step in enumerate(steps):
        row = {"step": step, **tm.measure(tiny_gpt(step), probe)}
        row["induction"][INDUCTION_HEAD[0]][INDUCTION_HEAD[1]] = INDUCTION[index]
        row["previous_token"][PREVIOUS_TOKEN_HEAD[0]][PREVIOUS_TOKEN_HEAD[1]] = PREVIOUS_TOKEN[index]
        rows.append(row)
    return rows


def make_run_folder(folder: Path) -> Path:
    """A model folder (the last step) with its ``over-training/``: measures and the snapshots of :data:`SNAPSHOTS`."""
    save(tiny_gpt(STEPS[-1]), folder)
    series = folder / SERIES_DIR
    for step in SNAPSHOTS:
        save(tiny_gpt(step), series / snapshot_name(step), half=True)
    rows = measured_rows()
    change = tm.phase_change(STEPS, [row["induction"] for row in rows])
    written = {"seconds": 1.0, "threads": 1, "rule": tm.PHASE_RULE,
               "phase_change": change.as_dict() if change else None, "snapshots": SNAPSHOTS, "rows": rows}
    (series / MEASURES_FILE).write_text(json.dumps(written, indent=1) + "\n")
    return folder
