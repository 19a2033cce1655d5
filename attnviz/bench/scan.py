"""``python -m attnviz.bench scan``: what a scan costs beside the model's own forward, in one run.

Over the same documents of the bundled corpus (each read up to ``max_tokens``, batch of one; by default the
first 1,000, the command line's default scan), documents/s and tokens/s of: the model's forward alone (tokenizer
and model); attnviz's capture (the forward with every attention call recorded); the scan in this process
(capture, every head's statistics, the database); the scan on a local Ray cluster with 1 and 2 workers. Then the
peak memory of command-line scans of growing corpora, each in a process of its own (the scan's memory should not
grow with the corpus). Ratios are measured in this run, on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from attnviz.corpus.scan import store

CHILD = """
import json, resource, sys, time
started = time.perf_counter()
from attnviz.corpus.scan.__main__ import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "seconds": time.perf_counter() - started,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _forward_rate(bundle, texts: list[str], max_tokens: int) -> tuple[float, int]:
    """Seconds for the model's own forward over ``texts``, each tokenized (as a capture reads them) and run, and
    the tokens read: what running the model over the corpus costs, before anything is recorded."""
    from attnviz.models.capture import _model_inputs

    tokens = 0
    with torch.no_grad():
        bundle.model(**_model_inputs(bundle, texts[0], None, max_tokens, None)[0])  # warm
        started = time.perf_counter()
        for text in texts:
            inputs = _model_inputs(bundle, text, None, max_tokens, None)[0]
            bundle.model(**inputs)
            tokens += int(inputs["input_ids"].shape[-1])
    return time.perf_counter() - started, tokens


def _capture_seconds(bundle, texts: list[str], max_tokens: int) -> float:
    from attnviz.models.capture import capture

    started = time.perf_counter()
    for text in texts:
        capture(bundle, text, max_tokens=max_tokens)
    return time.perf_counter() - started


def _scan_seconds(run, path: Path) -> float:
    path.unlink(missing_ok=True)
    started = time.perf_counter()
    run(path)
    return time.perf_counter() - started


def _memory(sizes: list[int], max_tokens: int, folder: Path, model: str) -> list[dict]:
    """Peak memory of command-line scans of ``sizes`` documents: the bundled corpus's documents, cycled (each copy
    marked, so that no two texts are the same) to the largest size, in a .jsonl file."""
    from attnviz.corpus.documents import bundled_corpus

    documents = bundled_corpus().documents
    corpus = folder / "memory-corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as handle:
        for index in range(max(sizes)):
            copy, document = divmod(index, len(documents))
            text = documents[document].text + (f" (copy {copy})" if copy else "")
            handle.write(json.dumps({"text": text}) + "\n")
    rows = []
    for size in sizes:
        out = folder / f"memory-{size}.duckdb"
        out.unlink(missing_ok=True)
        result = subprocess.run(
            [sys.executable, "-c", CHILD, str(corpus), "--model", model, "--out", str(out), "--max-docs",
             str(size), "--max-tokens", str(max_tokens), "--quiet"],
            capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
        said = json.loads(result.stdout.strip().splitlines()[-1])
        with store.ScanReader(out) as reader:
            scanned = reader.documents
        rows.append({"documents": scanned, "peak_mb": said["peak_mb"], "seconds": said["seconds"],
                     "database_mb": out.stat().st_size / 1024**2})
        out.unlink(missing_ok=True)
    return rows


def bench_scan(documents: int = 1_000, max_tokens: int = 128, ray_workers: tuple[int, ...] = (1, 2),
               memory_sizes: tuple[int, ...] = (1_000, 10_000), model: str | None = None) -> dict:
    """``model``: a checkpoint folder or a bundled model's name (default: the bundled BERT)."""
    from attnviz.corpus.documents import Corpus, bundled_corpus
    from attnviz.corpus.scan.runner import ScanSettings, run_scan
    from attnviz.models.loading import load_model_dir
    from attnviz.models.shipped import DEFAULT_MODEL_NAME, bundled_models

    model = model or DEFAULT_MODEL_NAME
    bundled = bundled_models()
    bundle = load_model_dir(bundled.get(model, model), name=model if model in bundled else None)
    corpus = bundled_corpus()
    chosen = Corpus(corpus.name, corpus.documents[:documents])
    texts = [document.text for document in chosen.documents]
    # the statistics pass alone against the forward; the sample of queries and keys (a fixed cost, a few dozen
    # documents read again at the end) timed apart below
    settings = ScanSettings(max_docs=documents, max_tokens=max_tokens, qk_points=0)
    forward, tokens = _forward_rate(bundle, texts, max_tokens)
    rows = [{"path": "forward (tokenizer and model, nothing recorded)", "seconds": forward}]
    rows.append({"path": "capture (every attention call recorded)",
                 "seconds": _capture_seconds(bundle, texts, max_tokens)})
    with tempfile.TemporaryDirectory(prefix="attnviz-bench-scan-") as scratch:
        folder = Path(scratch)
        rows.append({"path": "scan in-process", "seconds": _scan_seconds(
            lambda path: run_scan(chosen, bundle, path, settings), folder / "local.duckdb"),
            "database_mb": (folder / "local.duckdb").stat().st_size / 1024**2})
        sample = _sample_seconds(bundle, chosen, folder / "local.duckdb", max_tokens)
        # before Ray: a process started after ray.init inherits its environment, and peaked ~550 MB higher
        memory = _memory(list(memory_sizes), max_tokens, folder, model) if memory_sizes else []
        if ray_workers:
            rows += _ray_rows(chosen, bundle, settings, ray_workers, folder)
    for row in rows:
        row["documents_per_second"] = documents / row["seconds"]
        row["tokens_per_second"] = tokens / row["seconds"]
        row["vs_forward"] = row["seconds"] / forward
    report = {"model": bundle.name, "shape": f"{bundle.n_layers} layers x {bundle.n_heads} heads, d_model "
              f"{bundle.d_model}", "documents": documents, "tokens": tokens, "max_tokens": max_tokens,
              "threads": torch.get_num_threads(), "results": rows, "memory": memory, "sample": sample}
    if len(memory) >= 2:
        report["memory_growth"] = memory[-1]["peak_mb"] / memory[0]["peak_mb"] - 1
    return report


def _sample_seconds(bundle, corpus, path: Path, max_tokens: int) -> dict:
    """The end of a scan with the default sample: its documents read again and kept, and PCA of every head."""
    import duckdb

    from attnviz.corpus.scan import qk_sample
    from attnviz.corpus.scan.runner import scanned_kind

    kind = scanned_kind(bundle)[0]
    texts = {doc: document.text for doc, document in enumerate(corpus.documents)}
    with duckdb.connect(str(path)) as connection:
        started = time.perf_counter()
        qk_sample.record_sample(connection, bundle, kind, texts, qk_sample.DEFAULT_POINTS, max_tokens)
        seconds = time.perf_counter() - started
        facts = qk_sample.sample_facts(connection)
    return {"seconds": seconds, "points": qk_sample.DEFAULT_POINTS, "documents": facts["documents"],
            "tokens": facts["tokens"], "database_mb": path.stat().st_size / 1024**2}


def _ray_rows(corpus, bundle, settings, workers: tuple[int, ...], folder: Path) -> list[dict]:
    from attnviz.corpus.on_ray import ray_available
    from attnviz.corpus.scan.on_ray import run_scan_on_ray

    if not ray_available():
        return []
    import ray

    rows = []
    ray.init(num_cpus=max(2, max(workers)), include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        for count in workers:
            seconds = _scan_seconds(lambda path, count=count: run_scan_on_ray(
                corpus, bundle, path, settings, address=None, workers=count), folder / f"ray-{count}.duckdb")
            rows.append({"path": f"scan on Ray, {count} worker{'s' if count > 1 else ''} (model load included)",
                         "seconds": seconds})
    finally:
        ray.shutdown()
    return rows


def print_scan(report: dict) -> list[str]:
    lines = [f"Scan of {report['documents']} bundled documents ({report['tokens']:,} tokens, at most "
             f"{report['max_tokens']} each) with {report['model']} ({report['shape']}), {report['threads']} torch "
             "threads:"]
    for row in report["results"]:
        extra = f", database {row['database_mb']:.1f} MB" if "database_mb" in row else ""
        lines.append(f"  {row['path']:<58} {row['documents_per_second']:7.1f} doc/s {row['tokens_per_second']:9,.0f} "
                     f"tok/s  {row['vs_forward']:5.2f}x the forward{extra}")
    sample = report.get("sample")
    if sample:
        lines.append(f"  then the queries and keys sample ({sample['points']:,} tokens a head: {sample['documents']} "
                     f"documents, {sample['tokens']:,} tokens) and PCA of every head: {sample['seconds']:.1f} s "
                     f"(database then {sample['database_mb']:.1f} MB)")
    for row in report["memory"]:
        lines.append(f"  command-line scan of {row['documents']:>6,} documents: peak {row['peak_mb']:,.0f} MB, "
                     f"{row['seconds']:,.0f} s, database {row['database_mb']:,.1f} MB")
    if "memory_growth" in report:
        lines.append(f"  peak memory growth from the smallest to the largest corpus: {report['memory_growth']:+.1%}")
    return lines
