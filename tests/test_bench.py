"""The benchmark commands run end to end and write their JSON (no timing is asserted: that is their output)."""

import json

from attnviz.bench.__main__ import main


def test_explore_benchmark_runs_and_writes_json(tmp_path, capsys):
    out = tmp_path / "explore.json"
    assert main(["explore", "--repeats", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [row["tokens"] for row in report["results"]] == [32, 512]
    assert set(report["results"][0]["figure_bytes"]) == {"head", "grid", "lines", "average", "rollout"}
    printed = capsys.readouterr().out
    assert "32-token warm path" in printed and "JSON written" in printed


def test_pages_benchmark_runs_the_real_pages_and_names_the_slow_parts(tmp_path, capsys):
    out = tmp_path / "pages.json"
    assert main(["pages", "--repeats", "1", "--only", "Positional", "Checkpoints", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {row["page"]: row for row in report["results"]}
    assert set(rows) == {"Positional encodings", "Checkpoints"}
    positional = rows["Positional encodings"]
    assert positional["widget"] == "pos_sin_k" and positional["widget_change_s"] > 0
    shares = [share for _, share in positional["slowest_parts"]]
    assert shares and all(0 < share <= 1 for share in shares) and shares == sorted(shares, reverse=True)
    printed = capsys.readouterr().out
    assert "Slowest warm rerun:" in printed and "Positional encodings" in printed


def test_slowest_parts_counts_only_the_repositorys_own_code_not_a_sibling_folder_with_the_same_prefix():
    """A virtual environment beside the checkout whose folder name starts with the checkout's (``…/attnviz`` and
    ``…/attnviz-venv``) is not inside it: a string prefix said it was, then ``relative_to`` raised. Functions are
    compiled under those file names (the files need not exist: cProfile reads the code's file name)."""
    import cProfile

    from attnviz.bench.pages import ROOT, own_module, slowest_parts

    sibling = ROOT.parent / f"{ROOT.name}-venv" / "lib" / "python3.11" / "site-packages" / "streamlit" / "slow.py"
    inner = ROOT / ".venv" / "lib" / "python3.11" / "site-packages" / "streamlit" / "slow.py"
    own = ROOT / "attnviz" / "pagelogic" / "made_up.py"
    page = ROOT / "attnviz" / "app" / "app_pages" / "positional.py"

    def function_in(filename, name):
        namespace = {}
        exec(compile(f"def {name}():\n    return sum(range(20000))\n", str(filename), "exec"), namespace)
        return namespace[name]

    calls = [function_in(sibling, "outside"), function_in(inner, "in_a_venv"), function_in(own, "ours"),
             function_in(ROOT / "tests" / "made_up.py", "a_test"), function_in(page, "main")]
    profiler = cProfile.Profile()
    profiler.enable()
    for call in calls:
        call()
    profiler.disable()
    named = [name for name, _ in slowest_parts(profiler, "app_pages/positional.py", total_s=1.0, top=50)]
    assert named == ["attnviz.pagelogic.made_up.ours"]  # not the venvs, a test, or the page's entry point
    assert own_module(str(sibling)) is None and own_module(str(inner)) is None
    assert own_module(str(ROOT.parent / f"{ROOT.name}-venv" / "attnviz" / "units.py")) is None
    assert own_module(str(ROOT / "attnviz" / "core" / "units.py")) == "attnviz.core.units"
    assert own_module(str(ROOT / "app.py")) == "app" and own_module("~") is None
    assert own_module("<frozen importlib._bootstrap>") is None


def test_scan_benchmark_compares_with_the_forward_and_measures_memory(tmp_path, capsys):
    out = tmp_path / "scan.json"
    assert main(["scan", "--documents", "6", "--max-tokens", "24", "--ray-workers", "--memory-docs", "3", "6",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    paths = [row["path"] for row in report["results"]]
    assert paths == ["forward (tokenizer and model, nothing recorded)", "capture (every attention call recorded)",
                     "scan in-process"]
    assert report["results"][0]["vs_forward"] == 1.0 and all(row["seconds"] > 0 for row in report["results"])
    assert [row["documents"] for row in report["memory"]] == [3, 6] and report["memory"][0]["peak_mb"] > 100
    assert report["sample"]["documents"] == 6 and report["sample"]["seconds"] > 0  # 6 short documents fit 2,048
    printed = capsys.readouterr().out
    assert "x the forward" in printed and "peak memory growth" in printed and "queries and keys sample" in printed


def test_ablation_benchmark_times_every_map_against_the_forwards(tmp_path, capsys):
    out = tmp_path / "ablation.json"
    assert main(["ablation", "--texts", "4", "--max-tokens", "16", "--repeats", "2", "--shape", "2", "3", "24",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["heads"] == 6 and report["texts"] == 4 and report["batch_shape"][0] == 4
    assert set(report["seconds"]) == {"zero ablation map", "mean ablation map", "gradient importance"}
    assert all(value > 0 for value in report["per_forward_of_heads"].values())
    printed = capsys.readouterr().out
    assert "forwards (" in printed and "target at most 1.2x" in printed and "JSON written" in printed


def test_queries_keys_benchmark_times_every_heads_picture(tmp_path, capsys):
    out = tmp_path / "queries_keys.json"
    assert main(["queries-keys", "--points", "300", "--tokens", "24", "--embed-points", "120",
                 "--shape", "2", "2", "32", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["points_per_head"] >= 300 and report["documents"] >= 2
    assert set(report["median_seconds_per_head"]) == {"normalise", "PCA", "trust"}
    assert all(isinstance(report["embedding_seconds"][m], float) for m in ("t-SNE", "UMAP", "UMAP again"))
    assert report["figure_points"] == 3 * report["points_per_head"] // 2 and 0 < report["figure_bytes"] < 2_000_000
    printed = capsys.readouterr().out
    assert "for every head" in printed and "t-SNE of one head" in printed and "MB sent" in printed


def test_patching_benchmark_times_each_map_against_the_forwards_it_needs(tmp_path, capsys):
    from attnviz.bench.patching import batch_rows

    out = tmp_path / "patching.json"
    assert main(["patching", "--repeats", "1", "--period", "8", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["tokens"] == 1 + 8 + 4 and report["rows_per_forward"] == 16
    sites = report["sites"]
    assert set(sites) == {"resid", "attn", "mlp", "head"}
    layers, heads = 3, 4  # the bundled tiny GPT
    cells = {"resid": (layers + 1) * 13, "attn": layers * 13, "mlp": layers * 13, "head": layers * heads * 13}
    for site, row in sites.items():
        assert row["cells"] == row["naive_forwards"] == cells[site]
        assert row["forwards"] == 2 + -(-cells[site] // 16) == len(row["batch_rows"])
        assert row["batch_rows"] == batch_rows(cells[site], 16) and row["batch_rows"][:2] == [2, 1]
        assert row["rows_in_all"] == 3 + cells[site] + row["forwards"] - 2
        assert row["ratio"] > 0 and len(row["map_seconds"]) == len(row["forwards_seconds"]) == 1
        assert set(row["phase_ratios"]) == {"ends", "capture", "cells", "cells, hooks only"}
    assert sites["head"]["by_position"] and sites["head"]["grid"] == [layers, heads, 13]
    printed = capsys.readouterr().out
    assert "ratio" in printed and "target at most 1.2x" in printed and "naive:" in printed
    assert "residual stream" in printed and "JSON written" in printed


def test_train_step_benchmark_times_both_batches_plain_and_fused(tmp_path, capsys):
    import os

    import torch

    out = tmp_path / "train-step.json"
    threads = torch.get_num_threads()
    assert main(["train-step", "--repeats", "1", "--steps", "1", "--threads", "0", "--out", str(out)]) == 0
    assert torch.get_num_threads() == threads  # the worker's own setting, back
    report = json.loads(out.read_text())
    assert report["threads"] == os.cpu_count()  # 0: every core, as the training command takes it
    kinds = report["kinds"]
    assert kinds["short"]["shape"] == [16, 128] and kinds["long"]["shape"] == [8, 256]  # the recipe's batches
    assert kinds["short"]["steps_in_recipe"] + kinds["long"]["steps_in_recipe"] == 7500
    for times in kinds.values():
        assert len(times["plain"]) == len(times["fused"]) == 1 and times["ratio"] > 0
        assert times["ratio"] == times["fused"][0] / times["plain"][0]
    assert report["recipe_fused_seconds"] == sum(t["fused_median"] * t["steps_in_recipe"] for t in kinds.values())
    assert "fused / plain" in capsys.readouterr().out
