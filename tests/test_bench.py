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
