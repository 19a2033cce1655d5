"""attnviz installed as a user installs it: ``pip install <checkout>`` into a fresh virtual environment, then run
from a folder outside the checkout. The environment sees this interpreter's packages (``--system-site-packages``:
the dependencies are installed already, and CI has no time to download torch twice); attnviz itself is built from
a copy of the checkout's files, so nothing is built inside the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("pyproject.toml", "README.md", "attnviz")  # what a build of the package reads


@dataclass(frozen=True)
class Installed:
    venv: Path
    home: Path  # an empty folder outside the checkout: every command runs there

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def command(self) -> Path:
        return self.venv / "bin" / "attnviz"

    def environment(self) -> dict[str, str]:
        """This process's environment without anything that would put the checkout on the path."""
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
        return {**env, "PATH": f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}

    def run(self, *arguments, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in arguments], cwd=self.home, env=self.environment(), capture_output=True,
                              text=True, timeout=timeout)


def install(where: Path) -> Installed:
    """A fresh environment under ``where`` with attnviz installed from a copy of the checkout."""
    source = where / "source"
    source.mkdir(parents=True)
    for name in SHIPPED:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    home = where / "home"
    home.mkdir()
    installed = Installed(venv, home)
    # The wheel is built by this interpreter's setuptools (a new virtual environment's own may be too old to build
    # one), then installed as pip installs any wheel.
    wheels = where / "wheels"
    _step(installed, sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "--quiet", "--wheel-dir", wheels, source)
    _step(installed, installed.python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
          *sorted(wheels.glob("attnviz-*.whl")))
    return installed


def _step(installed: Installed, *command) -> None:
    result = installed.run(*command, timeout=600)
    if result.returncode:
        raise RuntimeError(f"{' '.join(map(str, command[1:4]))} failed:\n{result.stdout[-3000:]}\n"
                           f"{result.stderr[-3000:]}")
