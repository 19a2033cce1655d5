"""``python -m attnviz.bench queries-keys``: what a picture of queries and keys costs, in one run.

Captures a GPT-2-small-shaped model (12 layers x 12 heads, width 768, random weights made from a config, the
bundled BERT's tokenizer: the cost does not depend on what the weights learnt) on documents of the bundled corpus
until each head has about ``points`` queries and keys together, then times, for every head, the normalisation
(pooling the documents), PCA in 2D and the trust measure; on one head, t-SNE and UMAP on ``embed_points`` of its
points (UMAP twice: a process's first compiles numba's code); and the size of the page's figure of one head with its
values (every point, a third set), as sent to the browser. Medians per head and the total for the model are printed.
"""

from __future__ import annotations

import statistics
import time

import torch


def _captures(tokens_per_document: int, points: int, layers: int, heads: int, width: int):
    import tempfile
    from pathlib import Path

    import transformers

    from attnviz.bench.tiny import VOCAB, make_tiny_checkpoint
    from attnviz.corpus.documents import bundled_corpus
    from attnviz.models.capture import capture
    from attnviz.models.loading import load_model_dir

    config = transformers.GPT2Config(n_layer=layers, n_head=heads, n_embd=width, vocab_size=VOCAB, n_positions=1024,
                                     bos_token_id=0, eos_token_id=0)
    records, total = [], 0
    with tempfile.TemporaryDirectory() as folder:
        bundle = load_model_dir(make_tiny_checkpoint("gpt2", Path(folder) / "gpt2", config=config))
        for document in bundled_corpus().documents:
            record = capture(bundle, document.text, max_tokens=tokens_per_document).records["self"]
            records.append(record)
            total += record.n_q + record.n_k
            if total >= points:
                break
    return records, total


def bench_queries_keys(points: int = 10_000, tokens_per_document: int = 128, embed_points: int = 2_000,
                layers: int = 12, heads: int = 12, width: int = 768) -> dict:
    from attnviz.pagelogic import queries_keys

    started = time.perf_counter()
    records, total = _captures(tokens_per_document, points, layers, heads, width)
    capture_seconds = time.perf_counter() - started
    steps = {"normalise": [], "PCA": [], "trust": []}
    for layer in range(layers):
        for head in range(heads):
            started = time.perf_counter()
            head_points = queries_keys.head_points(records, layer, head)
            steps["normalise"].append(time.perf_counter() - started)
            started = time.perf_counter()
            coordinates = queries_keys.project(head_points, "PCA")
            steps["PCA"].append(time.perf_counter() - started)
            started = time.perf_counter()
            queries_keys.trust(head_points, coordinates)
            steps["trust"].append(time.perf_counter() - started)
    few = []
    for record in records:  # the first documents, up to embed_points points, for the slower projections
        few.append(record)
        if sum(r.n_q + r.n_k for r in few) >= embed_points:
            break
    sample = queries_keys.head_points(few, layers // 2, 0)
    embeddings = {}
    for method in ("t-SNE", "UMAP", "UMAP again"):
        started = time.perf_counter()
        try:
            queries_keys.project(sample, method.removesuffix(" again"))
        except ValueError as missing:
            embeddings[method] = str(missing)
            continue
        embeddings[method] = time.perf_counter() - started
    from attnviz.viz.queries_keys import head_scatter

    largest = queries_keys.head_points(records, 0, 0, values=True)
    started = time.perf_counter()
    figure = head_scatter(largest, queries_keys.project(largest, "PCA", with_values=True), title="one head",
                          colour="token category").to_json()
    figure_seconds = time.perf_counter() - started
    return {"model": f"GPT-2-shaped, {layers} x {heads}, width {width}, random weights", "documents": len(records),
            "points_per_head": total, "threads": torch.get_num_threads(), "capture_seconds": capture_seconds,
            "median_seconds_per_head": {step: statistics.median(times) for step, times in steps.items()},
            "model_seconds": {step: sum(times) for step, times in steps.items()},
            "embed_points": len(sample.queries) + len(sample.keys), "embedding_seconds": embeddings,
            "figure_points": len(largest.queries) + 2 * len(largest.keys), "figure_bytes": len(figure),
            "figure_seconds": figure_seconds}


def print_queries_keys(report: dict) -> list[str]:
    lines = [f"{report['model']}; {report['documents']} documents, {report['points_per_head']:,} points per head "
             f"(queries and keys), {report['threads']} threads; captured in {report['capture_seconds']:.1f} s"]
    per_head, whole = report["median_seconds_per_head"], report["model_seconds"]
    for step in per_head:
        lines.append(f"{step}: median {per_head[step] * 1000:.1f} ms per head, {whole[step]:.1f} s for every head")
    total = sum(whole.values())
    lines.append(f"every head's PCA picture and trust, from the captures: {total:.1f} s")
    for method, seconds in report["embedding_seconds"].items():
        lines.append(f"{method} of one head's {report['embed_points']:,} points: " +
                     (f"{seconds:.1f} s" if isinstance(seconds, float) else seconds))
    lines.append(f"one head's picture with its values ({report['figure_points']:,} points): "
                 f"{report['figure_bytes'] / 1e6:.2f} MB sent, built in {report['figure_seconds']:.2f} s")
    return lines
