"""``python -m attnviz.bench series``: what measuring one checkpoint of a series costs beside the forwards its measures
need, in one run.

It writes ``checkpoints`` GPT-2s of one shape (by default the bundled tiny GPT's: 3 layers x 4 heads, width 128, 256
positions; random weights, one seed each) as ``step100/``, ``step200/``, ... in a temporary folder, with the bundled
tiny GPT's tokenizer once in the series folder, then:

- runs the series as a user does (:func:`attnviz.corpus.series.runner.run_series`, in-process, into DuckDB): its
  wall time per checkpoint, and each checkpoint's loading and measures as the run records them;
- for each checkpoint, loaded as the run loads it, times in each of ``repeats`` rounds (each round's two timed back
  to back, alternating which goes first) the measures (:func:`attnviz.interventions.training_measures.measure` on
  the run's probe) against the plain forwards of the same batches under ``torch.no_grad()``: the held-out windows
  (16 x 128 tokens), the repeated random tokens (8 x 81) and the ablation batch (the repeated tokens once per head:
  layers x heads x 8 rows, in one forward), with the same eager attention.

It prints the medians and the ratio (the median of the rounds' ratios), the loading against the measures, and the
whole run's seconds per checkpoint.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

TOKENIZER = ("tokenizer.json", "tokenizer_config.json")


def write_series(root: Path, checkpoints: int, layers: int, heads: int, width: int, positions: int = 256) -> list[int]:
    """``checkpoints`` GPT-2s of random weights (seeds 0, 1, ...) in ``root/step100``, ``root/step200``, ..., and the
    bundled tiny GPT's tokenizer in ``root``; returns the steps."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from attnviz.models.shipped import BUNDLED_GPT_DIR

    steps = [100 * (index + 1) for index in range(checkpoints)]
    for seed, step in enumerate(steps):
        torch.manual_seed(seed)
        config = GPT2Config(vocab_size=4096, n_positions=positions, n_layer=layers, n_head=heads, n_embd=width,
                            bos_token_id=0, eos_token_id=0)
        GPT2LMHeadModel(config).save_pretrained(root / f"step{step}")
    root.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER:
        shutil.copy(BUNDLED_GPT_DIR / name, root / name)
    return steps


def plain_forwards(model: torch.nn.Module, batches: list[torch.Tensor]) -> float:
    """Seconds of one plain forward of each batch (no weights returned, no hooks), under ``torch.no_grad()``."""
    started = time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            model(input_ids=batch)
    return time.perf_counter() - started


def timed_measure(model: torch.nn.Module, probe) -> float:
    """Seconds of every measure of one checkpoint on the probe."""
    from attnviz.interventions import training_measures as tm

    began = time.perf_counter()
    tm.measure(model, probe)
    return time.perf_counter() - began


def bench_series(checkpoints: int = 6, repeats: int = 3, layers: int = 3, heads: int = 4, width: int = 128) -> dict:
    from attnviz.corpus.series import folder as sfolder
    from attnviz.corpus.series import probe as sprobe
    from attnviz.corpus.series import runner as sr
    from attnviz.corpus.series import steps as ssteps
    from attnviz.corpus.series.store import SeriesReader
    from attnviz.interventions import training_measures as tm

    with tempfile.TemporaryDirectory(prefix="attnviz-bench-series-") as scratch:
        root = Path(scratch) / "series"
        steps = write_series(root, checkpoints, layers, heads, width)
        database = Path(scratch) / "series.duckdb"
        began = time.perf_counter()
        state = sr.run_series(root, database)
        run_seconds = time.perf_counter() - began
        with SeriesReader(database) as reader:
            recorded = reader.steps()
        series = sfolder.find_series(root)
        probe = sprobe.series_probe(sfolder.series_tokenizer(series), sprobe.probe_text(None), sr.DEFAULT_SETTINGS,
                                    series.shape)
        work = ssteps.StepWork(probe, series.root, series.tokenizer, frozenset(), series.layers)
        batches = [probe.held_out, probe.repeated, probe.repeated.repeat(layers * heads, 1)]
        measures, forwards, loads = [], [], []
        for step in steps:
            began = time.perf_counter()
            model = ssteps.load_step(root / f"step{step}", work, False)
            loads.append(time.perf_counter() - began)
            tm.measure(model, probe)  # warm: every batch shape once
            plain_forwards(model, batches)
            for round_ in range(repeats):
                if round_ % 2 == 0:  # alternate which comes first, so that a drifting machine favours neither
                    measures.append(timed_measure(model, probe))
                    forwards.append(plain_forwards(model, batches))
                else:
                    forwards.append(plain_forwards(model, batches))
                    measures.append(timed_measure(model, probe))
            del model
    ratios = [m / f for m, f in zip(measures, forwards, strict=True)]
    return {
        "model": f"GPT-2, {layers} layers x {heads} heads, width {width}, vocabulary 4,096 (random weights)",
        "checkpoints": checkpoints, "repeats": repeats, "threads": torch.get_num_threads(),
        "probe": {"held_out": list(probe.held_out.shape), "repeated": list(probe.repeated.shape),
                  "ablation": [len(batches[2]), probe.repeated.shape[1]]},
        "status": state.status,
        "run_seconds_per_checkpoint": run_seconds / checkpoints,
        "run_load_seconds_median": float(recorded["load_seconds"].median()),
        "run_measure_seconds_median": float(recorded["measure_seconds"].median()),
        "load_seconds_median": statistics.median(loads),
        "measure_seconds_median": statistics.median(measures),
        "forwards_seconds_median": statistics.median(forwards),
        "ratio": statistics.median(ratios),
        "ratio_of_minima": min(measures) / min(forwards),
        "measure_seconds": measures, "forwards_seconds": forwards,
    }


def print_series(report: dict) -> list[str]:
    probe = report["probe"]
    return [
        f"{report['checkpoints']} checkpoints of a {report['model']}; {report['threads']} threads; probe: held-out "
        f"{probe['held_out'][0]} x {probe['held_out'][1]}, repeated {probe['repeated'][0]} x {probe['repeated'][1]}, "
        f"ablation batch {probe['ablation'][0]} x {probe['ablation'][1]}",
        f"measures {report['measure_seconds_median']:.3f} s, plain forwards of the same batches "
        f"{report['forwards_seconds_median']:.3f} s: ratio {report['ratio']:.2f}x (median of "
        f"{len(report['measure_seconds'])} rounds' ratios; of the minima {report['ratio_of_minima']:.2f}x)",
        f"loading a checkpoint (every file checked) {report['load_seconds_median']:.3f} s; the whole run "
        f"{report['run_seconds_per_checkpoint']:.2f} s per checkpoint (loading {report['run_load_seconds_median']:.3f} "
        f"s, measures {report['run_measure_seconds_median']:.3f} s, as recorded; the rest: finding and checking the "
        "series, the tokenizer and the probe, and DuckDB)",
    ]
