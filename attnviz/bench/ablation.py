"""``python -m attnviz.bench ablation``: what a head-importance map costs beside the model's own forwards, in one run.

A map ablates each head alone and runs the model again on every text (batched): ``heads + 1`` forwards (the clean
one first). Over the same texts (the first ``texts`` sentences of 8 to 30 words in the bundled corpus, each read
up to ``max_tokens``), this times the model's plain forward of the batch (median of ``repeats``), then the
zero-ablation map, the mean-ablation map and gradient importance (one forward and one backward), and prints each
map's time against ``heads`` and ``heads + 1`` plain forwards. The model is GPT-2-small-shaped by default (12 layers
x 12 heads, width 768, random weights made from a config, the bundled BERT's tokenizer: the cost does not depend on
what the weights learnt), or any checkpoint folder given with ``--model``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch


def _texts(count: int) -> list[str]:
    """The first ``count`` sentences of 8 to 30 words in the bundled corpus (Python's documentation and
    docstrings), in order."""
    import re

    from attnviz.corpus.documents import bundled_corpus

    texts = []
    for document in bundled_corpus().documents:
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(document.text.split())):
            if 8 <= len(sentence.split()) <= 30:
                texts.append(sentence)
                if len(texts) == count:
                    return texts
    return texts


def _model(folder: str | None, layers: int, heads: int, width: int):
    from attnviz.interventions.edits import ATTENTION_NAME, editable_lm
    from attnviz.models.shipped import default_model_dir

    if folder:
        return editable_lm(folder), Path(folder).name
    import transformers

    # the bundled BERT's WordPiece tokenizer (30,522 tokens): about as many tokens per sentence as GPT-2's BPE
    tokenizer = transformers.AutoTokenizer.from_pretrained(default_model_dir(), local_files_only=True)
    config = transformers.GPT2Config(n_layer=layers, n_head=heads, n_embd=width, vocab_size=len(tokenizer),
                                     n_positions=1024, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.set_attn_implementation(ATTENTION_NAME)
    return (model, tokenizer), f"GPT-2-shaped, {layers} x {heads}, width {width}, random weights"


def _progress(how: str):
    """Prints how far a map is, every tenth of it (to stderr: the report stays on stdout)."""
    shown = [-1]

    def report(share: float, what: str) -> None:
        if int(share * 10) > shown[0]:
            shown[0] = int(share * 10)
            print(f"  {how} ablation map: {share:.0%} ({what})", file=sys.stderr, flush=True)

    return report


def bench_ablation(texts: int = 50, max_tokens: int = 32, repeats: int = 5, folder: str | None = None,
                   layers: int = 12, heads: int = 12, width: int = 768) -> dict:
    from attnviz.interventions import importance as imp

    (model, tokenizer), described = _model(folder, layers, heads, width)
    objective = imp.objective_of(model)
    batch = imp.batch_of(tokenizer, _texts(texts), objective, max_tokens)
    modules = imp.attention_modules(model, batch.inputs)
    n_heads = sum(module.heads for module in modules)
    forwards = []
    with torch.no_grad():
        model(**batch.inputs)  # warm
        for _ in range(repeats):
            started = time.perf_counter()
            model(**batch.inputs)
            forwards.append(time.perf_counter() - started)
    forward = statistics.median(forwards)
    timings = {}
    for how in imp.ABLATIONS:
        started = time.perf_counter()
        imp.ablation_map(model, batch, how, objective=objective, modules=modules, progress=_progress(how))
        timings[f"{how} ablation map"] = time.perf_counter() - started
    if objective != "hidden":
        started = time.perf_counter()
        imp.gradient_importance(model, batch, objective=objective, modules=modules)
        timings["gradient importance"] = time.perf_counter() - started
    return {
        "model": described, "objective": objective, "texts": len(batch.texts), "tokens": int(batch.real.sum()),
        "batch_shape": list(batch.inputs["input_ids"].shape), "heads": n_heads, "threads": torch.get_num_threads(),
        "forward_seconds_median": forward, "forward_seconds": forwards, "seconds": timings,
        "per_forward_of_heads": {name: seconds / (n_heads * forward) for name, seconds in timings.items()
                                 if "map" in name},
        "per_forward_of_heads_plus_clean": {name: seconds / ((n_heads + 1) * forward)
                                            for name, seconds in timings.items() if "map" in name},
        "gradient_per_forward": timings.get("gradient importance", float("nan")) / forward,
    }


def print_ablation(report: dict) -> list[str]:
    lines = [f"{report['model']}; {report['texts']} texts, {report['tokens']:,} tokens (batch "
             f"{report['batch_shape'][0]} x {report['batch_shape'][1]}), {report['heads']} heads, "
             f"{report['threads']} threads; objective: {report['objective']}",
             f"forward of the batch: median {report['forward_seconds_median']:.3f} s over "
             f"{len(report['forward_seconds'])}"]
    for name, seconds in report["seconds"].items():
        if "map" in name:
            lines.append(f"{name}: {seconds:.1f} s = {report['per_forward_of_heads'][name]:.2f}x {report['heads']} "
                         f"forwards ({report['per_forward_of_heads_plus_clean'][name]:.2f}x {report['heads'] + 1}, "
                         "with the clean one; target at most 1.2x)")
        else:
            lines.append(f"{name}: {seconds:.2f} s = {report['gradient_per_forward']:.1f}x one forward")
    return lines
