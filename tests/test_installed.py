"""attnviz as a user installs it: ``pip install <checkout>`` in a fresh virtual environment, then used from a folder
outside the checkout: the command, a scan, the notebook API and the app's script (its browser check is in
tests/e2e/test_installed_in_browser.py)."""

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.serial]


def test_the_package_is_imported_from_the_environment_with_its_data(installed_attnviz):
    result = installed_attnviz.run(installed_attnviz.python, "-c", """if True:
        import json, attnviz
        from attnviz.app import SCRIPT
        from attnviz.checkpoints.safety import MAX_UPLOAD_BYTES, STREAMLIT_CONFIG
        from attnviz.models.shipped import bundled_models
        from attnviz.ui.page_scripts import ASSETS
        print(json.dumps({"package": attnviz.__file__, "script": str(SCRIPT), "config": str(STREAMLIT_CONFIG),
                          "pages": sorted(p.name for p in (SCRIPT.parent / "app_pages").glob("*.py")),
                          "assets": sorted(p.name for p in ASSETS.iterdir()), "upload": MAX_UPLOAD_BYTES,
                          "models": {name: str(folder) for name, folder in bundled_models().items()}}))""")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    site = str(installed_attnviz.venv)
    assert found["package"].startswith(site) and found["script"].startswith(site) and found["config"].startswith(site)
    assert len(found["pages"]) == 13 and "explore_heads.py" in found["pages"]
    assert {"icon.png", "svg_downloads.js"} <= set(found["assets"])
    assert found["upload"] == 2048 * 1024**2  # read from the settings shipped beside the script
    tiny = [folder for name, folder in found["models"].items() if name.startswith("tiny GPT")]
    assert tiny and tiny[0].startswith(site)  # the bundled GPT ships inside the package


def test_the_command_lists_its_subcommands_options_and_the_bundled_models(installed_attnviz):
    overview = installed_attnviz.run(installed_attnviz.command, "--help")
    assert overview.returncode == 0
    for name in ("serve", "scan", "importance", "bench", "train-tiny", "all-MiniLM-L6-v2", "tiny GPT"):
        assert name in overview.stdout
    scan_help = installed_attnviz.run(installed_attnviz.command, "scan", "--help")
    assert scan_help.returncode == 0 and scan_help.stdout.startswith("usage: attnviz scan")
    flat = " ".join(scan_help.stdout.split())
    assert "--max-docs MAX_DOCS" in flat and "(default: 1,000)" in flat and "(default: 128)" in flat
    assert "tiny GPT" in scan_help.stdout  # --model names the bundled models
    for command in ("importance", "bench", "train-tiny", "serve"):
        helped = installed_attnviz.run(installed_attnviz.command, command, "--help")
        assert helped.returncode == 0 and helped.stdout.startswith(f"usage: attnviz {command}"), helped.stderr
    wrong = installed_attnviz.run(installed_attnviz.command, "scna")
    assert wrong.returncode == 2 and "no command 'scna'" in wrong.stderr
    assert installed_attnviz.run(installed_attnviz.python, "-m", "attnviz", "--version").stdout.startswith("attnviz ")


def test_the_command_scans_a_corpus_and_the_api_reads_it(installed_attnviz):
    scanned = installed_attnviz.run(installed_attnviz.command, "scan", "bundled", "--model", "tiny", "--out",
                                    "scan.duckdb", "--max-docs", "4", "--max-tokens", "32", "--quiet")
    assert scanned.returncode == 0, scanned.stderr
    assert (installed_attnviz.home / "scan.duckdb").is_file()  # written where the user is, not in the package
    read = installed_attnviz.run(installed_attnviz.python, "-c", """if True:
        import attnviz
        run = attnviz.open_scan("scan.duckdb")
        heads = run.heads()
        print(run.status, run.done, len(heads), heads["layer"].nunique())""")
    assert read.returncode == 0, read.stderr
    status, done, rows, layers = read.stdout.split()
    assert (status, done) == ("finished", "4") and int(rows) == int(layers) * 4  # the tiny GPT: 4 heads a layer


def test_the_notebook_api_works_on_a_model_built_in_memory(installed_attnviz):
    """A model built in the session itself (never saved): captured, shown and detected, with HF's own eager
    weights as the reference."""
    result = installed_attnviz.run(installed_attnviz.python, "-c", """if True:
        import torch, attnviz
        from transformers import GPT2Config, GPT2LMHeadModel
        from attnviz.models.shipped import bundled_models
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(str(bundled_models()["tiny GPT (bundled, trained by attnviz)"]))
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=4,
                            attn_implementation="eager")
        model = GPT2LMHeadModel(config).eval()
        text = "the cat sat on the mat . the cat sat on the mat ."
        captured = attnviz.capture(model, tokenizer, text)
        ids = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            reference = model(**ids, output_attentions=True).attentions
        difference = max(float((captured.weights(l) - reference[l][0]).abs().max()) for l in range(2))
        figure = attnviz.show.head(captured, 1, 2)
        found = attnviz.detect(captured, "induction")
        print(difference, len(found), type(figure).__name__, captured.replay.passed)""")
    assert result.returncode == 0, result.stderr
    difference, rows, figure, replay = result.stdout.split()
    assert float(difference) < 1e-5 and rows == "8" and figure == "NotebookFigure" and replay == "True"


def test_the_installed_app_renders_its_first_page(installed_attnviz):
    """The installed script, run as Streamlit runs a session (AppTest), opens Explore heads without an exception."""
    result = installed_attnviz.run(installed_attnviz.python, "-c", """if True:
        from streamlit.testing.v1 import AppTest
        from attnviz.app import SCRIPT
        at = AppTest.from_file(str(SCRIPT), default_timeout=240).run()
        assert not at.exception, [e.value for e in at.exception]
        print([t.value for t in at.title][:1], len(at.get("plotly_chart")))""", timeout=400)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Explore heads" in result.stdout
