"""The installation report: optional packages and what needs them."""

import builtins

from attnviz.app import SCRIPT
from attnviz.system import runtime


def test_triton_present_here():
    (triton,) = runtime.optional_features()
    assert triton.package == "triton" and triton.available and triton.version


def test_missing_triton_is_reported_with_what_needs_it(monkeypatch):
    real_import = builtins.__import__

    def no_triton(name, *args, **kwargs):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("No module named 'triton'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr("importlib.import_module", lambda name: no_triton(name))
    (triton,) = runtime.optional_features()
    assert not triton.available and "Triton flash-attention kernel" in triton.needed_for


def test_app_starts_and_says_so_without_triton(monkeypatch):
    from streamlit.testing.v1 import AppTest


    monkeypatch.setattr(
        runtime, "optional_features",
        lambda: [runtime.OptionalFeature("triton", False, None, runtime.OPTIONAL_PACKAGES["triton"])],
    )
    at = AppTest.from_file(str(SCRIPT), default_timeout=120).run()
    assert not at.exception
    notes = [m.value for m in at.sidebar.markdown]
    assert any("triton** is not installed" in note and "flash-attention kernel" in note for note in notes), notes
