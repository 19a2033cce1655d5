"""One job model for both corpus runs: a run's options and settings are dataclasses that go to JSON and back
unchanged, a settings file holds only their fields with values of their types, the command-line options are
generated from the same fields (defaults in --help), the command line wins over a file, and a page's job is told
everything by the one file it is given: the database is the one the flags give."""

import json
import time

import pytest

from attnviz.corpus.command import (
    RunOptions,
    job_command,
    parse,
    parser_of,
    read_settings_file,
    settings_json,
    write_settings_file,
)
from attnviz.corpus.importance.__main__ import IMPORTANCE
from attnviz.corpus.importance.runner import ImportanceSettings
from attnviz.corpus.options import SettingsRefused, as_json, built, checked_values
from attnviz.corpus.scan.__main__ import SCAN
from attnviz.corpus.scan.runner import ScanRefused, ScanSettings

OPTIONS = RunOptions(corpus="bundled", model="tiny", out="/tmp/x.duckdb", field_name="body", threads=3,
                     stop_file="/tmp/x.stop", disk_limit=10, quiet=True)


@pytest.mark.parametrize("value", [ScanSettings(max_docs=7, max_tokens=9, chunk_docs=2, qk_points=0),
                                   ImportanceSettings(max_docs=5, methods=("zero", "gradient")), OPTIONS])
def test_settings_go_to_json_and_back_unchanged(value):
    text = json.dumps(as_json(value))
    assert built(type(value), checked_values((type(value),), json.loads(text), "here")) == value


def write(tmp_path, value) -> str:
    path = tmp_path / "settings.json"
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return str(path)


@pytest.mark.parametrize("content, said", [
    ({"max_docs": 5, "max_tokns": 3}, "'max_tokns': no setting of that name"),
    ({"max_docs": "5"}, "max_docs must be int, not '5'"),
    ({"max_docs": True}, "max_docs must be int"),
    ({"quiet": 1}, "quiet must be bool"),
    ({"model": None}, "model must be str, not None"),
    ({"methods": ["zero"]}, "'methods': no setting of that name"),  # an importance run's setting, not a scan's
    ({"kind": "importance"}, "the settings of 'importance', not of 'scan'"),
    ([1, 2], "no JSON object"),
    ("{not json", "is not JSON"),
    ({"corpus": "x" * 70_000}, "larger than a settings file"),
])
def test_a_settings_file_holds_only_the_fields_with_values_of_their_type(tmp_path, content, said):
    with pytest.raises(SettingsRefused, match=said):
        read_settings_file(write(tmp_path, content), SCAN)


def test_a_range_a_settings_file_breaks_is_refused_by_the_settings_themselves(tmp_path):
    options, values = parse(SCAN, ["--settings", write(tmp_path, {"corpus": "bundled", "model": "m", "out": "o",
                                                                  "max_tokens": 1})])
    with pytest.raises(ScanRefused, match="at least 2 tokens"):
        ScanSettings(**values)


def test_the_command_line_wins_over_the_file_and_the_file_over_the_defaults(tmp_path):
    path = write(tmp_path, {"kind": "importance", "corpus": "bundled", "model": "m", "out": "o.duckdb",
                            "max_docs": 9, "chunk_docs": 3, "methods": ["zero"], "quiet": True})
    options, values = parse(IMPORTANCE, ["--settings", path, "--chunk", "4", "--methods", "mean, gradient",
                                         "scan:other.duckdb"])
    assert options == RunOptions(corpus="scan:other.duckdb", model="m", out="o.duckdb", quiet=True)
    assert ImportanceSettings(**values) == ImportanceSettings(max_docs=9, chunk_docs=4, methods=("mean", "gradient"))
    options, values = parse(SCAN, ["bundled", "--model", "m", "--out", "o", "--field", "body", "--qk-points", "0"])
    assert (options.field_name, ScanSettings(**values)) == ("body", ScanSettings(qk_points=0))


def test_a_run_without_its_corpus_model_or_output_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse(SCAN, ["--settings", write(tmp_path, {"corpus": "bundled", "model": "m"})])
    assert "required: out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(SCAN, ["--settings", str(tmp_path / "missing.json")])
    assert "--settings" in capsys.readouterr().err


def test_the_options_and_their_defaults_come_from_the_fields():
    scan = " ".join(parser_of(SCAN).format_help().split())
    for said in ("--max-docs MAX_DOCS the corpus's first documents read (default: 1,000)", "--chunk CHUNK_DOCS",
                 "(default: 64)", "--qk-points N", "(default: 2,048)", "--field FIELD_NAME", "--settings FILE.json",
                 "--disk-limit BYTES", "(default: no limit)", "stop (resumably) after the chunk"):
        assert said in scan
    importance = " ".join(parser_of(IMPORTANCE).format_help().split())
    assert "(default: 200)" in importance and "(default: zero,mean,gradient)" in importance
    assert "scan:FILE.duckdb" in importance and "--qk-points" not in importance


def test_a_job_is_its_kind_key_and_one_settings_file(tmp_path):
    """A page's job: the settings file beside its database says everything, the command nothing else."""
    from attnviz.corpus.background import ScanFolder
    from attnviz.corpus.jobs import JobQueue

    folder = ScanFolder(tmp_path / "scans", queue=JobQueue(tmp_path / "queue"))
    settings = ScanSettings(max_docs=2, max_tokens=8, qk_points=0)
    job = folder.start("k", "bundled", "/nowhere", settings, dtype="fp32", model_name="mine", disk_bytes=1000)
    said = json.loads(folder.settings_file("k").read_text())
    assert said == settings_json("scan", RunOptions(
        corpus="bundled", model="/nowhere", out=str(folder.database("k")), name="mine", dtype="fp32",
        threads=said["threads"], progress_file=str(folder.progress_file("k")), stop_file=str(folder.stop_file("k")),
        disk_limit=1000, quiet=True), settings)
    queued = json.loads((tmp_path / "queue" / "queue.json").read_text())
    assert [entry["command"] for entry in queued] == [job_command("scan", folder.settings_file("k"))]
    assert job.corpus == "bundled" and job.kind == "scan"
    deadline = time.monotonic() + 60
    while folder.job() is not None:  # no model there: the child reads its file, then fails in words
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert folder.progress("k")["status"] == "failed" and "/nowhere" in folder.progress("k")["error"]


def test_a_settings_file_scans_as_the_flags_do(tmp_path):
    from attnviz.corpus.scan.__main__ import main
    from attnviz.models.shipped import DEFAULT_MODEL_NAME
    from tests.test_scan import TEXTS, assert_same_tables, tables

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS), encoding="utf-8")
    settings = ScanSettings(max_docs=4, max_tokens=12, chunk_docs=3, qk_points=16)
    file = write_settings_file(tmp_path / "scan.settings.json", "scan", RunOptions(
        corpus=str(corpus), model=DEFAULT_MODEL_NAME, out=str(tmp_path / "file.duckdb"), quiet=True), settings)
    assert main(["--settings", str(file)]) == 0
    assert main([str(corpus), "--model", DEFAULT_MODEL_NAME, "--out", str(tmp_path / "flags.duckdb"), "--quiet",
                 "--max-docs", "4", "--max-tokens", "12", "--chunk", "3", "--qk-points", "16"]) == 0
    assert_same_tables(tables(tmp_path / "flags.duckdb"), tables(tmp_path / "file.duckdb"))
