"""docs/api.md is the API's docstrings as they are now, and every public name of the notebook API is in it."""

from pathlib import Path

import attnviz
from attnviz.api import reference

ROOT = Path(__file__).resolve().parents[1]


def test_docs_api_md_is_written_from_the_docstrings():
    assert (ROOT / "docs" / "api.md").read_text() == reference.reference(), \
        "docs/api.md is stale: python -m attnviz.api.reference > docs/api.md"


def test_every_name_import_attnviz_gives_is_documented():
    text = reference.reference()
    for name in attnviz.__all__:
        if name != "__version__":
            assert f"`attnviz.{name}" in text, name
    for name in ("head", "grid", "lines", "qk_map", "importance_map"):
        assert f"`attnviz.show.{name}(" in text
    assert "TransformerLens" in text  # the definitions beside TransformerLens's
