"""Every page survives hostile sentences: empty, very long, odd Unicode, markup. A message, never a traceback."""

import pytest

from tests.apptest_helpers import assert_no_failure, figures, open_page

PAGES = [
    "app_pages/explore_heads.py",
    "app_pages/step_by_step.py",
    "app_pages/masks.py",
    "app_pages/positional.py",
    "app_pages/scaling.py",
    "app_pages/heads_kv_cache.py",
    "app_pages/queries_keys.py",
]
MEANT_ERRORS = ("several spellings",)  # the Masks page's callout of a bug (an st.error on purpose, not a failure)
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
    assert_no_failure(at, allowed=MEANT_ERRORS)  # a page that catches a failure says so with st.error
    if kind == "empty" and page not in ("app_pages/heads_kv_cache.py", "app_pages/positional.py"):
        # (the first tabs of those two pages do not use the sentence)
        assert any("empty" in w.value.lower() for w in at.warning), page
    if kind == "long" and page == "app_pages/explore_heads.py":
        assert any("reads at most 512" in w.value for w in at.warning)


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    from tests.tiny_models import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("pages-tiny")
    return {kind: str(make_tiny_checkpoint(kind, root / kind)) for kind in ARCHITECTURES}


# the interface path (an encoder-only BERT is the bundled model), BLOOM on the hooks path, DeBERTa and MPT (a
# decoder with ALiBi) on the eager-weights path (see attnviz.models.eager)
ARCHITECTURES = ("gpt2", "llama", "bart", "t5", "bloom", "deberta-v2", "mpt")


@pytest.mark.parametrize("kind", ARCHITECTURES)
@pytest.mark.parametrize("page", [*PAGES, "app_pages/generation.py"])  # (Generation reads its own prompt)
def test_every_page_works_with_every_architecture(tiny_checkpoints, kind, page):
    models = {"all-MiniLM-L6-v2 (bundled BERT)": "unused", kind: tiny_checkpoints[kind]}
    at = open_page(page, timeout=240, models=models, model=kind)
    assert_no_failure(at, allowed=MEANT_ERRORS)


def _open(tiny_checkpoints, kind: str, page: str, **state):
    models = {"all-MiniLM-L6-v2 (bundled BERT)": "unused", kind: tiny_checkpoints[kind]}
    at = open_page(page, timeout=240, models=models, model=kind, **state)
    assert_no_failure(at, allowed=MEANT_ERRORS)
    return at


@pytest.mark.parametrize("kind", ["deberta-v2", "mpt"])
def test_the_eager_weights_path_says_so_on_every_view_that_needs_q_and_k(tiny_checkpoints, kind):
    at = _open(tiny_checkpoints, kind, "app_pages/explore_heads.py")
    assert any(kind in i.value and "not available" in i.value for i in at.info)  # which path, what it allows
    assert not any("Replay check" in m.value for m in at.markdown)  # nothing to replay
    for tab, what in (("Q·K", "The Q·K view"), ("What-if", "The what-if")):
        at = _open(tiny_checkpoints, kind, "app_pages/explore_heads.py", explore_tab=tab)
        assert any(i.value.startswith(what) and "queries and keys" in i.value for i in at.info), tab
    at = _open(tiny_checkpoints, kind, "app_pages/scaling.py")
    assert any(i.value.startswith("Rescaling a real head") for i in at.info)
    # the views that need only weights work: statistics, compare, export, every head view
    for tab in ("Head statistics", "Compare two sentences", "Export"):
        at = _open(tiny_checkpoints, kind, "app_pages/explore_heads.py", explore_tab=tab)
        assert not at.error, (tab, [e.value for e in at.error])
    for view in ("grid", "lines", "average", "rollout"):
        at = _open(tiny_checkpoints, kind, "app_pages/explore_heads.py", view=view)
        assert figures(at) and not at.error, view


def test_bloom_is_replayed_and_its_own_alibi_is_on_the_positional_page(tiny_checkpoints):
    at = _open(tiny_checkpoints, "bloom", "app_pages/explore_heads.py")
    assert any("hooks" in i.value and "ALiBi" in i.value for i in at.info)
    assert any("Replay check" in m.value and "reproduces" in m.value for m in at.markdown)
    at = _open(tiny_checkpoints, "bloom", "app_pages/positional.py", pos_tab="ALiBi")
    assert any("uses ALiBi itself" in m.value and "the paper's slopes for 4 heads" in m.value for m in at.markdown)
    titles = [spec["layout"]["title"]["text"] for spec in figures(at)]
    assert any("Its bias, head 0" in t for t in titles), titles


def test_no_download_reruns_its_page():
    """A download must not rerun the page: a rerun that starts while a deferred file is being made clears the
    messages waiting for the browser, the reply among them, and the button then stays disabled for three minutes
    (Streamlit 1.67's ForwardMsgQueue.clear keeps only lifecycle messages)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    calls = []
    for path in [root / "app.py", *sorted((root / "attnviz").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "download_button":
                on_click = {k.arg: k.value for k in node.keywords}.get("on_click")
                calls.append((f"{path.name}:{node.lineno}", isinstance(on_click, ast.Constant) and on_click.value))
    assert len(calls) >= 5  # the four exports, step by step's weights (the corpus's Parquet is a streamed link)
    assert [where for where, value in calls if value != "ignore"] == []
