"""The long-input benchmark runs end to end on a small checkpoint (its real sizes are run by hand)."""

from attnviz.bench import long


def test_long_benchmark_smoke(tmp_path):
    folder = long.make_checkpoint(tmp_path / "llama-shaped", layers=2, d_model=64, heads=4, kv_heads=2,
                                  max_positions=512)
    report = long.bench_long([128], folder=folder, progress=lambda line: None)
    row = report["results"][0]
    assert row["capture"]["tokens"] == 128
    assert row["capture"]["kept_bytes"]["queries"] == 2 * 4 * 128 * 16 * 4  # layers x heads x N x d x fp32
    assert 0 < row["figure"]["figure_bytes"] < 2_000_000
    lines = long.print_long(report)
    assert any(line.startswith("Target capture time") for line in lines)
