"""attnviz: transformer attention from scratch, explained with real numbers.

In a notebook::

    import attnviz
    captured = attnviz.capture("tiny GPT", "The cat sat on the mat. The cat sat on the mat.")
    attnviz.show.grid(captured, layer=2)          # every head of a layer, as Explore heads draws it
    attnviz.detect(captured, "induction")         # every head's score, highest first (a pandas DataFrame)

``capture``, ``show``, ``detect``, ``scan``, ``importance``, ``open_scan``, ``open_importance``, ``patch``, ``paths``,
``induction_examples``, ``example``, ``attribute``, ``logit_lens``, ``composition``, ``patch_corpus``,
``open_patching``, ``measure_series``, ``open_series``, ``series_scan_statistics`` and ``series_scan_maps`` come from
``attnviz.api`` and are imported on first use, so ``import attnviz`` alone stays light. The installed command is
``attnviz`` (``attnviz serve`` runs the app; ``python -m attnviz`` is the same command).

The package's folders, from the bottom layer up (docs/architecture.md draws them): ``core``, ``system``,
``checkpoints``, ``flash``, ``viz``, ``models``, ``interventions``, ``tiny_gpt``, ``corpus``, ``pagelogic``, ``ui``,
``api``, ``bench``, ``app``. Conventions used everywhere in the package:

* tensors are ``[batch, heads, seq, head_dim]``;
* masks are boolean with **True = may attend** (PyTorch SDPA's convention); ``attnviz.core.masks`` converts from and
  to the other conventions at the edges.
"""

__version__ = "0.1.0"

__all__ = ["capture", "show", "detect", "scan", "importance", "open_scan", "open_importance", "patch", "paths",
           "induction_examples", "example", "attribute", "logit_lens", "composition", "patch_corpus", "open_patching",
           "measure_series", "open_series", "series_scan_statistics", "series_scan_maps", "__version__"]


def __getattr__(name: str):
    """The notebook API's names, imported when first asked for (torch and transformers load then, not before)."""
    if name == "show":
        from attnviz.api import show

        return show
    if name in ("capture", "bundle_of"):
        from attnviz.api import capture as capturing

        return getattr(capturing, name)
    if name == "detect":
        from attnviz.api.detect import detect

        return detect
    if name in ("scan", "importance"):
        from attnviz.api import runs

        return getattr(runs, name)
    if name in ("patch", "paths", "induction_examples", "example", "attribute", "logit_lens", "composition"):
        from attnviz.api import patching

        return getattr(patching, name)
    if name in ("patch_corpus", "open_patching", "PatchingRun"):
        from attnviz.api import patching_runs

        return getattr(patching_runs, name)
    if name in ("measure_series", "open_series", "series_scan_statistics", "series_scan_maps"):
        from attnviz.api import series

        return getattr(series, name)
    if name in ("open_scan", "open_importance"):
        from attnviz.api import run_files

        return getattr(run_files, name)
    raise AttributeError(f"module 'attnviz' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
