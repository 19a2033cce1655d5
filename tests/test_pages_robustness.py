"""Every page survives hostile sentences: empty, very long, odd Unicode, markup. A message, never a traceback."""

import pytest

from tests.apptest_helpers import open_page

PAGES = [
    "pages/explore_heads.py",
    "pages/step_by_step.py",
    "pages/masks.py",
    "pages/positional.py",
    "pages/scaling.py",
    "pages/heads_kv_cache.py",
]
SENTENCES = {
    "empty": "   ",
    "long": " ".join(["the quick brown fox jumps over the lazy dog."] * 70),  # ~700 tokens: truncated to 512
    "unicode": "naïve café — 日本語 🤖 \u200b zero\u200dwidth \u202eRTL\u202c ﷽ e\u0301",
    "markup": "<script>alert(1)</script> **bold** $x$ & <b>tag</b>",
}


@pytest.fixture(autouse=True)
def _clean(clean_streamlit_caches):
    yield


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("kind", list(SENTENCES))
def test_page_survives(page, kind):
    at = open_page(page, timeout=240, sentence=SENTENCES[kind])
    assert not at.exception, [e.value for e in at.exception]
    if kind == "empty" and page not in ("pages/heads_kv_cache.py", "pages/positional.py"):
        # (the first tabs of those two pages do not use the sentence)
        assert any("empty" in w.value.lower() for w in at.warning), page
    if kind == "long" and page == "pages/explore_heads.py":
        assert any("reads at most 512" in w.value for w in at.warning)


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    from tests.tiny_models import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("pages-tiny")
    return {kind: str(make_tiny_checkpoint(kind, root / kind)) for kind in ("gpt2", "llama", "bart", "t5")}


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bart", "t5"])
@pytest.mark.parametrize("page", [*PAGES, "pages/generation.py"])  # (Generation reads its own prompt)
def test_every_page_works_with_every_architecture(tiny_checkpoints, kind, page):
    models = {"all-MiniLM-L6-v2 (bundled BERT)": "unused", kind: tiny_checkpoints[kind]}
    at = open_page(page, timeout=240, models=models, model=kind)
    assert not at.exception, [e.value for e in at.exception]
    problems = [e.value for e in at.error if "several spellings" not in e.value]  # (the Masks page's bug callout)
    assert not problems, problems
