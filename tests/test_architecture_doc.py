"""docs/architecture.md's tree and the package's own docstrings describe the same layout: every folder of the
package is in the tree, and every package's ``__init__`` docstring names each module it holds."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "attnviz"
PACKAGES = sorted(path.parent for path in PACKAGE.rglob("__init__.py"))


def layout_tree() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Layout"):text.index("## Conventions")]
    return section[section.index("```"):section.rindex("```")]


def tree_folders() -> set[str]:
    """The folders the tree names, as paths under the repository (from their indentation)."""
    found, stack = set(), []
    for line in layout_tree().splitlines():
        match = re.match(r"^( *)([\w.-]+)/ ", line + " ")
        if not match:
            continue
        depth = len(match.group(1)) // 2
        stack[depth:] = [match.group(2)]
        found.add("/".join(stack))
    return found


@pytest.mark.parametrize("package", PACKAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_package_is_in_the_tree(package):
    assert str(package.relative_to(ROOT)) in tree_folders()


@pytest.mark.parametrize("package", PACKAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_package_docstring_names_its_modules(package):
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    assert docstring, f"{package} has no docstring"
    if package == PACKAGE:
        names = [path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()]
    else:
        names = [path.stem for path in package.glob("*.py") if path.stem != "__init__"]
        names += [path.name for path in package.iterdir() if (path / "__init__.py").exists()]
    missing = [name for name in names if f"``{name}``" not in docstring and f":mod:`.{name}`" not in docstring]
    assert not missing, f"{package.relative_to(ROOT)}'s docstring does not name {missing}"


def test_every_module_says_what_it_is_for():
    silent = [str(path.relative_to(ROOT)) for path in PACKAGE.rglob("*.py")
              if path.stat().st_size and not ast.get_docstring(ast.parse(path.read_text()))]
    assert not silent


def test_the_tree_names_no_folder_that_is_gone():
    gone = [folder for folder in tree_folders() if not (ROOT / folder).is_dir()]
    assert not gone
