"""The package's layers, as docs/architecture.md draws them: every import (at module level or inside a function)
points down, never up and never sideways between siblings; only the app layer imports Streamlit; nothing reaches
into another package's private names."""

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "attnviz"

# Each group of modules and its rank: a module may import its own group and groups of a lower rank only.
RANKS = {
    "core": 0,  # attnviz/*.py: the from-scratch attention, masks, positions, statistics, units
    "flash": 1, "models": 1, "viz": 1,  # each on the core only, never on each other
    "pagelogic": 2,  # what each page computes
    "scan": 2,  # corpus scans: capture, statistics, the database, Ray
    "train_tiny": 2,  # the bundled GPT's training script (reads models' loading)
    "streamlit_compat": 3,  # the one reach past Streamlit's public API
    "ui": 4,  # the app layer: pages' frame, session models, caches, figures
    "bench": 5,  # the benchmarks measure everything
}
STREAMLIT_GROUPS = {"ui", "streamlit_compat", "bench"}


def group_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in ("flash", "models", "viz", "pagelogic", "scan", "ui", "bench"):
        return parts[1]
    if module in ("attnviz.train_tiny", "attnviz.streamlit_compat"):
        return parts[1]
    return "core"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
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


@pytest.mark.parametrize("path", MODULES, ids=lambda path: module_name(path))
def test_imports_point_down(path):
    module = module_name(path)
    here = group_of(module)
    wrong = []
    for imported, name, line in imports_of(path):
        top = imported.split(".")[0]
        if top == "attnviz":
            target = imported if imported != "attnviz" or name is None else f"attnviz.{name}"
            there = group_of(target)
            if there != here and RANKS[there] >= RANKS[here]:
                wrong.append(f"line {line}: {module} ({here}) imports {target} ({there})")
        elif top == "streamlit" and here not in STREAMLIT_GROUPS:
            wrong.append(f"line {line}: {module} ({here}) imports streamlit")
        elif top != "attnviz" and name is not None and name.startswith("_") and name != "__version__":
            wrong.append(f"line {line}: {module} imports {imported}.{name}, a private name")
    assert not wrong, "\n".join(wrong)


def test_the_layer_table_knows_every_group():
    assert {group_of(module_name(path)) for path in MODULES} <= set(RANKS)


@pytest.mark.parametrize("path", MODULES, ids=lambda path: module_name(path))
def test_every_module_imports(path):
    """Every module imports (a name moved elsewhere fails here, not first in a benchmark or a browser test)."""
    importlib.import_module(module_name(path))
