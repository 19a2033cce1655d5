"""The package's metadata and the checkout's requirement files say the same thing, and what the package ships
is what the app reads at run time."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements(path: Path) -> set[str]:
    """The requirement lines of a requirements file, without comments, includes or spaces."""
    lines = (line.split(" #")[0].strip() for line in path.read_text().splitlines())
    return {line.replace(" ", "") for line in lines if line and not line.startswith(("#", "-r"))}


def normalised(requirement: str) -> str:
    return requirement.replace(" ", "").replace("'", '"')


def test_requirements_txt_is_the_dependencies_with_the_app_s_extras():
    """`pip install -r requirements.txt` (the README's app) installs what `pip install ".[app,umap,triton]"` does."""
    extras = PROJECT["optional-dependencies"]
    declared = {normalised(r) for r in [*PROJECT["dependencies"], *extras["app"], *extras["umap"], *extras["triton"]]}
    assert requirements(ROOT / "requirements.txt") == declared


def test_requirements_dev_is_the_dev_extra():
    """The test-only extras of requirements-dev.txt are the dev extra's packages (with ray and train's, which it
    takes through attnviz[all])."""
    extras = PROJECT["optional-dependencies"]
    dev = {normalised(r) for r in extras["dev"] if not r.startswith("attnviz")}
    assert requirements(ROOT / "requirements-dev.txt") == dev | {normalised(r) for r in extras["ray"] + extras["train"]}


def test_the_package_data_covers_what_the_app_reads_from_files():
    """Every non-Python file the installed app opens is declared as package data (a wheel holds nothing else)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    declared = {Path(package.replace(".", "/")) / pattern for package, patterns in data.items() for pattern in patterns}
    needed = [path.relative_to(ROOT) for folder in ("attnviz",) for path in (ROOT / folder).rglob("*")
              if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts]
    needed += [path.relative_to(ROOT) for path in (ROOT / "attnviz" / "app" / "app_pages").glob("*.py")]
    missing = [str(path) for path in needed if not any(path.match(str(pattern)) for pattern in declared)]
    assert not missing


def test_the_command_is_declared():
    assert PROJECT["scripts"] == {"attnviz": "attnviz.app.command:main"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", PROJECT["version"])
    from attnviz import __version__

    assert __version__ == PROJECT["version"]
