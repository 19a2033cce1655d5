"""The API reference, docs/api.md, written from the docstrings (they are its source): ``python -m
attnviz.api.reference > docs/api.md``; a test checks the file is what this writes."""

from __future__ import annotations

import inspect
import sys
from types import ModuleType

INTRODUCTION = """# The attnviz API

`import attnviz` gives the notebook API: capture a model's attention (a model in memory, a checkpoint folder or a
bundled model), show it with the app's own figures (inline and offline in Jupyter, VS Code and Colab-style
frontends), detect heads, and run scans and importance runs over a corpus (results in DuckDB, with progress bars;
a stopped run resumes). The names below are imported on first use, so `import attnviz` alone stays light.

This page is written from the docstrings by `python -m attnviz.api.reference > docs/api.md`. A worked example:
[examples/induction_heads.ipynb](../examples/induction_heads.ipynb).
"""

# (module, public names in the order a reader meets them, the heading of its section)
SECTIONS = (
    ("attnviz.api.capture", ("capture", "Captured", "Replay", "bundle_of"), "Capture"),
    ("attnviz.api.show", ("head", "grid", "lines", "qk_map", "importance_map", "patching", "paths", "attribution",
                          "lens", "composition", "NotebookFigure",
                          "plotlyjs_in_every_figure", "send_plotlyjs_again"), "Show"),
    ("attnviz.api.detect", ("detect",), "Detect"),
    ("attnviz.api.patching", ("patch", "paths", "induction_examples", "example", "attribute", "logit_lens",
                               "composition"), "Patching, attribution, composition"),
    ("attnviz.api.runs", ("scan", "importance"), "Corpus runs"),
    ("attnviz.api.patching_runs", ("patch_corpus", "open_patching", "PatchingRun"), "Corpus patching"),
    ("attnviz.api.run_files", ("open_scan", "open_importance", "ScanRun", "ImportanceRun"), "Corpus runs' files"),
    ("attnviz.api.series", ("measure_series", "open_series", "series_scan_statistics", "series_scan_maps"),
     "Checkpoints over training"),
)


def _signature(thing) -> str:
    try:
        return str(inspect.signature(thing))
    except (TypeError, ValueError):
        return "(...)"


def _members(cls: type) -> list[tuple[str, object]]:
    """A class's public methods and properties defined on it or its attnviz bases, in source order."""
    found = {}
    for base in reversed(cls.__mro__):
        if not base.__module__.startswith("attnviz"):
            continue
        for name, value in vars(base).items():
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
                found[name] = value
    return list(found.items())


def _entry(prefix: str, name: str, thing) -> list[str]:
    if inspect.isclass(thing):
        lines = [f"### `{prefix}{name}`", "", inspect.getdoc(thing) or "", ""]
        for member, value in _members(thing):
            if isinstance(value, property):
                lines += [f"- `.{member}`: {(inspect.getdoc(value) or '').splitlines()[0] if value.__doc__ else ''}"]
            else:
                doc = inspect.getdoc(value) or ""
                lines += [f"- `.{member}{_signature(value)}`" + (f": {doc}" if doc else "")]
        return lines + [""]
    return [f"### `{prefix}{name}{_signature(thing)}`", "", inspect.getdoc(thing) or "", ""]


def reference() -> str:
    """docs/api.md's text."""
    import importlib

    lines = [INTRODUCTION]
    for module_name, names, heading in SECTIONS:
        module: ModuleType = importlib.import_module(module_name)
        prefix = "attnviz.show." if module_name.endswith(".show") else "attnviz."
        lines += [f"## {heading}", "", f"`{module_name}`: " + (inspect.getdoc(module) or ""), ""]
        for name in names:
            lines += _entry(prefix, name, getattr(module, name))
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference())
