"""``python -m attnviz.bench long``: long inputs on a Llama-shaped checkpoint the benchmark makes (random weights:
8 layers, d_model 512, 8 query / 2 K/V heads, RoPE, 32K positions), N = 512 .. 8192 tokens, each measured in a
fresh process: (a) the model's own forward with SDPA and no attentions kept, (b) the Explore page's capture,
(c) the first head figure, built and serialised for the browser. Time, peak extra memory, the ratios of (b) to
(a), and the figure's bytes.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from attnviz.system.measure import environment, run_in_fresh_process

LENGTHS = [512, 1024, 2048, 4096, 8192]
# What the recorded figures are checked against (docs/benchmarks.md).
TARGETS = {"capture time / SDPA forward time": 1.5, "capture peak / (1.5 x SDPA peak + Q/K kept)": 1.0,
           "figure bytes": 2_000_000}


def make_checkpoint(folder: Path, *, layers: int = 8, d_model: int = 512, heads: int = 8, kv_heads: int = 2,
                    max_positions: int = 32768) -> Path:
    """A Llama-shaped decoder with random weights and the bundled BERT's tokenizer (so real text goes in)."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaModel

    from attnviz.models.shipped import default_model_dir

    config = LlamaConfig(vocab_size=30522, hidden_size=d_model, intermediate_size=4 * d_model, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions)
    torch.manual_seed(0)
    LlamaModel(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (default_model_dir() / name).exists():
            shutil.copy(default_model_dir() / name, folder / name)
    return folder


def _child(spec_json: str) -> None:
    """One measurement in a fresh process (see :func:`attnviz.system.measure.print_peak_of`)."""
    import torch

    from attnviz.system.measure import print_peak_of
    from attnviz.system.runtime import configure_environment

    configure_environment()
    spec = json.loads(spec_json)
    from attnviz.models.capture import capture
    from attnviz.models.loading import load_model_dir
    from attnviz.pagelogic.explore_heads.long_texts import sample_text
    from attnviz.pagelogic.explore_heads.options import ViewOptions
    from attnviz.pagelogic.explore_heads.views import view_figure

    text, n = sample_text(), spec["n"]
    repeats = spec.get("repeats", 1)
    if spec["what"] == "sdpa":
        from transformers import AutoModel, AutoTokenizer

        model = AutoModel.from_pretrained(spec["folder"], attn_implementation="sdpa", local_files_only=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(spec["folder"], local_files_only=True)
        ids = tokenizer(text, truncation=True, max_length=n, return_tensors="pt")["input_ids"]

        def forward():
            with torch.no_grad():
                return model(input_ids=ids).last_hidden_state
        print_peak_of(forward, repeats=repeats)
        return
    bundle = load_model_dir(spec["folder"])
    if spec["what"] == "capture":
        def kept(result) -> dict:
            record = result.records["self"]
            sizes = {name: getattr(record, name).numel() * getattr(record, name).element_size()
                     for name in ("queries", "keys", "values")}
            return {"tokens": len(result.tokens), "kept_bytes": sizes}
        print_peak_of(lambda: capture(bundle, text, max_tokens=n), kept, repeats=repeats)
        return
    result = capture(bundle, text, max_tokens=n)
    print_peak_of(lambda: view_figure(result, ViewOptions(view="head"))[0].to_json(),
                  lambda figure_json: {"figure_bytes": len(figure_json)}, repeats=repeats)


def bench_long(lengths: list[int], *, folder: Path | None = None, progress=print, **shape) -> dict:
    folder = folder or make_checkpoint(Path(tempfile.mkdtemp(prefix="attnviz-long-")) / "llama-shaped", **shape)
    rows = []
    for n in lengths:
        row = {"n": n}
        for what in ("sdpa", "capture", "figure"):
            repeats = 3 if n <= 2048 else 1  # medians where a run is short enough to repeat
            spec = json.dumps({"what": what, "n": n, "folder": str(folder), "repeats": repeats})
            row[what] = run_in_fresh_process("attnviz.bench.long", "_child", spec, timeout=3600)
            peak = row[what]["peak_bytes"] / 2**20
            progress(f"  N={n:>5} {what:<8} {row[what]['seconds']:8.2f} s  peak {peak:8.1f} MiB")
        rows.append(row)
    return {"benchmark": "long", "checkpoint": "Llama-shaped, random weights, 8 layers, d_model 512, 8 / 2 heads",
            "environment": environment(), "results": rows}


def print_long(report: dict) -> list[str]:
    lines = [f"Long inputs on a {report['checkpoint']} (each number from a fresh process)",
             f"{'N':>6} {'SDPA fwd':>10} {'capture':>10} {'ratio':>6} {'SDPA peak':>10} {'capture peak':>13} "
             f"{'Q/K kept':>9} {'peak check':>10} {'figure':>9} {'figure KB':>10}"]
    checks = []
    for row in report["results"]:
        sdpa, cap, fig = row["sdpa"], row["capture"], row["figure"]
        qk = cap["kept_bytes"]["queries"] + cap["kept_bytes"]["keys"]
        time_ratio = cap["seconds"] / sdpa["seconds"]
        # A forward that fits in memory the process already holds reads 0: no ratio can be taken there.
        peak_ratio = cap["peak_bytes"] / (1.5 * sdpa["peak_bytes"] + qk) if sdpa["peak_bytes"] > 2**20 else None
        checks.append((row["n"], time_ratio, peak_ratio, fig["figure_bytes"]))
        lines.append(
            f"{row['n']:>6} {sdpa['seconds']:>9.2f}s {cap['seconds']:>9.2f}s {time_ratio:>5.2f}x "
            f"{sdpa['peak_bytes'] / 2**20:>8.0f}Mi {cap['peak_bytes'] / 2**20:>11.0f}Mi {qk / 2**20:>7.0f}Mi "
            f"{'—' if peak_ratio is None else f'{peak_ratio:.2f}x':>10} {fig['seconds']:>8.2f}s "
            f"{fig['figure_bytes'] / 1024:>9.0f}"
        )
    lines.append("peak check = capture peak / (1.5 x SDPA peak + the Q and K capture keeps); target <= 1 "
                 "(— where the forward's own peak reads 0: it fit in memory the process already held).")
    for name, limit, index in (("capture time / SDPA forward time", 1.5, 1), ("peak check", 1.0, 2),
                               ("figure bytes", 2_000_000, 3)):
        measured = [check[index] for check in checks if check[index] is not None]
        worst = max(measured) if measured else float("nan")
        lines.append(f"Target {name} <= {limit:g}: worst {worst:.3g} ({'met' if worst <= limit else 'MISSED'})")
    return lines
