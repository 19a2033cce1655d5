"""``python -m attnviz.bench patching``: what an activation-patching map costs beside the model's own forwards, in one
run.

A map of one example (:func:`attnviz.interventions.activation_patching.patch_map`) runs the clean and corrupted
prompts once (one forward of 2 rows: the ends), captures the source's activations (1 row), then patches its cells
``rows`` at a time, each forward carrying one more row that patches nothing (``rows + 1`` rows; the last forward the
cells left over, plus one): :func:`~attnviz.interventions.activation_patching.forwards_needed` forwards in all. For
the residual stream, the attention outputs, the MLP outputs and the heads by position, on the induction preset's
prompt (``period`` random tokens, then their first half again, after the BOS: ``1 + period + period // 2`` tokens),
this times, in each of ``repeats`` rounds:

- the map, called as a page calls it (``patch_map(model, examples, site)``: its model reading included);
- the plain forwards it needs, the same number with the same batch shapes, under ``torch.no_grad()``, on a second
  copy of the same checkpoint that no patch ever touched (patching installs forward hooks, which stay on the model,
  dormant outside a patch);
- where the difference goes: the map in its parts (the model reading, the ends, the capture, the cells' forwards),
  the cells' forwards with every hook firing but patching nothing (an identity edit: the hooks' own cost), and the
  plain forwards again on the patched model (what the dormant hooks cost a forward).

It prints each site's map time against its plain forwards' time (the median of the rounds' ratios, each round's two
timed back to back, alternating which goes first; target: at most 1.2x), the medians of both, and the naive count,
one unbatched forward per cell, for contrast. The model is the bundled tiny GPT, or any causal LM
checkpoint folder given with ``--model``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

TARGET = 1.2
SITES = (("resid", False), ("attn", False), ("mlp", False), ("head", True))


def _model(folder: str | None):
    """``(model, tokenizer, described, bos)`` as pages load it for editing."""
    from attnviz.interventions.edits import editable_lm
    from attnviz.models.shipped import BUNDLED_GPT_DIR, BUNDLED_GPT_NAME

    model, tokenizer = editable_lm(folder or BUNDLED_GPT_DIR)
    config = model.config
    shape = (f"{getattr(config, 'n_layer', getattr(config, 'num_hidden_layers', '?'))} layers x "
             f"{getattr(config, 'n_head', getattr(config, 'num_attention_heads', '?'))} heads, width "
             f"{getattr(config, 'n_embd', getattr(config, 'hidden_size', '?'))}, vocabulary {config.vocab_size:,}")
    name = Path(folder).name if folder else BUNDLED_GPT_NAME
    bos = 0 if folder is None else tokenizer.bos_token_id  # the bundled tiny GPT's BOS is token 0
    return model, tokenizer, f"{name} ({shape})", bos


def batch_rows(cells: int, rows_per_forward: int) -> list[int]:
    """The rows of each forward a map of ``cells`` cells runs: the ends (2), the capture (1), then the cells
    ``rows_per_forward`` at a time, each forward with one unpatched row more."""
    full, rest = divmod(cells, rows_per_forward)
    return [2, 1] + [rows_per_forward + 1] * full + ([rest + 1] if rest else [])


def _plain(model: torch.nn.Module, ids: list[int], rows: list[int]) -> list[float]:
    """Each forward's seconds: ``rows[i]`` copies of ``ids``, nothing hooked, no gradients."""
    batches = {count: torch.tensor([ids]).repeat(count, 1) for count in set(rows)}
    seconds = []
    with torch.no_grad():
        for count in rows:
            started = time.perf_counter()
            model(input_ids=batches[count])
            seconds.append(time.perf_counter() - started)
    return seconds


def _phases_of(seconds: list[float]) -> dict[str, float]:
    """Plain forwards' seconds (in :func:`batch_rows` order) by the part of the map they stand for."""
    return {"ends": seconds[0], "capture": seconds[1], "cells": sum(seconds[2:])}


def _map_in_parts(model: torch.nn.Module, example, site: str, by_position: bool, rows_per_forward: int
                  ) -> dict[str, float]:
    """The map's steps timed one by one (as :func:`patch_map` runs them on one example, denoising, logit
    difference), and its cells' forwards again with the site's hooks firing and patching nothing."""
    from attnviz.interventions import activation_patching as ap
    from attnviz.interventions.anatomy import anatomy

    seconds = {}
    started = time.perf_counter()
    parts = anatomy(model, {"input_ids": torch.tensor([example.clean])})
    seconds["anatomy"] = time.perf_counter() - started
    started = time.perf_counter()
    measured = ap.ends(model, example, "logit difference")
    seconds["ends"] = time.perf_counter() - started
    started = time.perf_counter()
    source = ap.capture_site(model, parts, site, example.clean)
    seconds["capture"] = time.perf_counter() - started
    cells, _ = ap.cells_of(site, model, parts, len(example.clean), by_position)
    started = time.perf_counter()
    ap.run_cells(model, parts, site, example.corrupted, source, cells,
                 lambda logits: ap.metric_of("logit difference", logits, example.answer, measured.foil),
                 rows_per_forward=rows_per_forward)
    seconds["cells"] = time.perf_counter() - started
    batches = {count: torch.tensor([example.corrupted]).repeat(count, 1)
               for count in set(batch_rows(len(cells), rows_per_forward)[2:])}
    started = time.perf_counter()
    with torch.no_grad(), ap._at_site(model, parts, site, lambda _, activation: activation):
        for count in batch_rows(len(cells), rows_per_forward)[2:]:
            model(input_ids=batches[count])
    seconds["cells, hooks only"] = time.perf_counter() - started
    return seconds


def _median_of(numerators: list[float], denominators: list[float]) -> float:
    """The median of the rounds' ratios."""
    return statistics.median(a / b for a, b in zip(numerators, denominators, strict=True))


def bench_patching(repeats: int = 5, period: int = 60, rows_per_forward: int = 16, folder: str | None = None) -> dict:
    from attnviz.core.circuits import ordinary_token_ids
    from attnviz.interventions import activation_patching as ap
    from attnviz.interventions.anatomy import anatomy
    from attnviz.interventions.patching import induction_prompts

    model, tokenizer, described, bos = _model(folder)
    plain_model, _, _, _ = _model(folder)  # never patched: no hooks on it
    prompts = induction_prompts(ordinary_token_ids(tokenizer), period, seed=0, bos=bos)
    examples = ap.examples_of(prompts)
    example = examples[0]
    n = len(example.clean)
    parts = anatomy(model, {"input_ids": torch.tensor([example.clean])})
    sites = {}
    for site, by_position in SITES:
        try:
            cells, grid = ap.cells_of(site, model, parts, n, by_position)
            if site == "mlp" and any(layer.mlp is None for layer in parts.layers):
                raise ValueError("this model's MLPs were not found")
        except ValueError as error:
            sites[site] = {"skipped": str(error)}
            continue
        rows = batch_rows(len(cells), rows_per_forward)
        forwards = ap.forwards_needed(site, model, parts, n, by_position=by_position,
                                      rows_per_forward=rows_per_forward)
        if forwards != len(rows):
            raise AssertionError(f"{site}: forwards_needed says {forwards}, the map's batches are {len(rows)}")
        sites[site] = {"label": ap.SITES[site] + (" by position" if by_position else ""), "by_position": by_position,
                       "grid": list(grid), "cells": len(cells), "forwards": forwards, "batch_rows": rows,
                       "rows_in_all": sum(rows), "naive_forwards": len(cells),
                       "map_seconds": [], "forwards_seconds": [], "dormant_hooks_forwards_seconds": [],
                       "plain_phases": [], "map_phases": []}
    short = ap.examples_of(induction_prompts(ordinary_token_ids(tokenizer), 4, seed=0, bos=bos))
    for site, by_position in SITES:  # warm: the map's code on a short prompt, both models on every batch shape
        if "skipped" not in sites[site]:
            ap.patch_map(model, short, site, by_position=by_position, rows_per_forward=rows_per_forward)
            _plain(plain_model, example.corrupted, sorted(set(sites[site]["batch_rows"])))
            _plain(model, example.corrupted, sorted(set(sites[site]["batch_rows"])))
    for round_ in range(repeats):
        for site, by_position in SITES:
            row = sites[site]
            if "skipped" in row:
                continue

            def timed_map(site=site, by_position=by_position) -> float:
                started = time.perf_counter()
                ap.patch_map(model, examples, site, by_position=by_position, rows_per_forward=rows_per_forward)
                return time.perf_counter() - started

            if round_ % 2 == 0:  # alternate which comes first, so that a drifting machine favours neither
                row["map_seconds"].append(timed_map())
                plain = _plain(plain_model, example.corrupted, row["batch_rows"])
            else:
                plain = _plain(plain_model, example.corrupted, row["batch_rows"])
                row["map_seconds"].append(timed_map())
            row["forwards_seconds"].append(sum(plain))
            row["plain_phases"].append(_phases_of(plain))
            row["dormant_hooks_forwards_seconds"].append(sum(_plain(model, example.corrupted, row["batch_rows"])))
            row["map_phases"].append(_map_in_parts(model, example, site, by_position, rows_per_forward))
    for row in sites.values():
        if "skipped" in row:
            continue
        # each round's ratios first, then their median: another process that slows a whole round (the machine is
        # shared) moves both sides of its ratios alike
        row["map_phase_seconds"], row["plain_phase_seconds"] = row.pop("map_phases"), row.pop("plain_phases")
        rounds = list(zip(row["map_phase_seconds"], row["plain_phase_seconds"], strict=True))
        one_row = statistics.median(plain["capture"] for plain in row["plain_phase_seconds"])
        row.update({
            "ratio": _median_of(row["map_seconds"], row["forwards_seconds"]),
            "map_seconds_median": statistics.median(row["map_seconds"]),
            "forwards_seconds_median": statistics.median(row["forwards_seconds"]),
            "dormant_hooks_ratio": _median_of(row["dormant_hooks_forwards_seconds"], row["forwards_seconds"]),
            "phase_ratios": {name: statistics.median(parts[name] / plain[of] for parts, plain in rounds)
                             for name, of in (("ends", "ends"), ("capture", "capture"), ("cells", "cells"),
                                              ("cells, hooks only", "cells"))},
            "anatomy_in_one_row_forwards": statistics.median(parts["anatomy"] / plain["capture"]
                                                             for parts, plain in rounds),
            "anatomy_seconds_median": statistics.median(parts["anatomy"] for parts, _ in rounds),
            "one_row_forward_seconds_median": one_row,
            "naive_seconds_estimate": row["naive_forwards"] * one_row,
        })
        row["ratio_of_medians"] = row["map_seconds_median"] / row["forwards_seconds_median"]
        row["ratio_of_minima"] = min(row["map_seconds"]) / min(row["forwards_seconds"])  # the least disturbed
    return {"model": described, "prompt": f"induction preset, period {period}, seed 0", "tokens": n,
            "period": period, "rows_per_forward": rows_per_forward, "repeats": repeats,
            "threads": torch.get_num_threads(), "target_ratio": TARGET, "sites": sites}


def print_patching(report: dict) -> list[str]:
    lines = [f"{report['model']}; {report['prompt']}: {report['tokens']} tokens; {report['rows_per_forward']} cells a "
             f"forward (+1 unpatched row); {report['threads']} threads; medians of {report['repeats']}"]
    for site, row in report["sites"].items():
        if "skipped" in row:
            lines.append(f"{site}: skipped ({row['skipped']})")
            continue
        phases = row["phase_ratios"]
        met = "met" if row["ratio"] <= report["target_ratio"] else "MISSED"
        lines += [
            f"{row['label']}: {row['cells']:,} cells in {row['forwards']} forwards ({row['rows_in_all']:,} rows; "
            f"naive: {row['naive_forwards']:,} forwards, one per cell, about {row['naive_seconds_estimate']:.2f} s): "
            f"map {row['map_seconds_median']:.3f} s, plain forwards {row['forwards_seconds_median']:.3f} s, ratio "
            f"{row['ratio']:.2f}x, median of the rounds' ratios (target at most {report['target_ratio']}x: {met}; "
            f"ratio of the medians {row['ratio_of_medians']:.2f}x, of the minima {row['ratio_of_minima']:.2f}x)",
            f"  where: ends {phases['ends']:.2f}x, capture {phases['capture']:.2f}x, cells {phases['cells']:.2f}x "
            f"(hooks alone {phases['cells, hooks only']:.2f}x) their plain forwards; reading the model "
            f"{row['anatomy_seconds_median'] * 1000:.1f} ms ({row['anatomy_in_one_row_forwards']:.1f} "
            f"one-row forwards); dormant hooks: plain forwards on the patched model "
            f"{row['dormant_hooks_ratio']:.2f}x",
        ]
    return lines

