"""One way to show a token on every page (#25): tokenizers' raw pieces as readable text with visible marks
(attnviz.core.tokens_display), for every tokenizer family the tests use, and the pages that show them: Explore heads'
axes, hovers, lines, Q·K, statistics, compare and what-if, the mechanism pages; exports keep the raw pieces."""

import json
import re

import numpy as np
import pytest

from attnviz.core.tokens_display import (
    BYTE_LEVEL,
    PLAIN,
    SENTENCEPIECE,
    WORDPIECE,
    piece_note,
    readable_token,
    readable_tokens,
    tokenizer_style,
)
from attnviz.models.capture import capture
from attnviz.models.loading import FallbackTokenizer, load_model_dir
from attnviz.models.shipped import BUNDLED_GPT_DIR, BUNDLED_GPT_NAME
from attnviz.pagelogic.explore_heads import matrices
from attnviz.pagelogic.explore_heads.bertviz_view import bertviz_html
from attnviz.pagelogic.explore_heads.compare import compare_figures
from attnviz.pagelogic.explore_heads.export import capture_npz, matrix_csv, matrix_json, shown_matrix
from attnviz.pagelogic.explore_heads.options import VIEWS, ViewOptions
from attnviz.pagelogic.explore_heads.qk import query_key, query_key_figures
from attnviz.pagelogic.explore_heads.statistics import statistics_table
from attnviz.pagelogic.explore_heads.views import view_figure
from attnviz.pagelogic.explore_heads.whatif import what_if
from tests.apptest_helpers import figures, open_page
from tests.tiny_models import SENTENCEPIECE_CLASSES, bundled_bert, make_tiny_checkpoint, write_sentencepiece_tokenizer

RAW_MARKS = ("Ġ", "Ċ", "ĉ", "▁")  # how byte-level BPE and SentencePiece write a space, a newline, a tab
TEXT = "The cat sat on the mat.\nIt was\ttired, très fatigué 日本."


def unmarked(shown: list[str]) -> str:
    """Readable tokens joined back into text: the marks as the characters they stand for, runs of ``<0xNN>`` (the
    bytes of characters split across tokens) decoded."""
    text = "".join(shown).replace("␣", " ").replace("↵", "\n").replace("⇥", "\t")
    return re.sub(r"(?:<0x[0-9A-F]{2}>)+",
                  lambda run: bytes(int(h, 16) for h in re.findall(r"<0x([0-9A-F]{2})>", run.group())).decode(),
                  text)


# ---------------------------------------------------------------------------------------------------------------
# readable_token, piece by piece


@pytest.mark.parametrize(("piece", "shown"), [
    ("Ġthe", "␣the"), ("the", "the"), ("Ċ", "↵"), ("ĊĊ", "↵↵"), ("ĉ", "⇥"), ("ĠĠĠ", "␣␣␣"), ("Ġ", "␣"),
    ("čĊ", "↵"), ("č", "<0x0D>"),  # a carriage return alone is invisible: its code
    # a line's indentation inside one piece is seen, a space between two characters stays a space
    ("ĊĠĠ", "↵␣␣"), ("ĊĠĠĠĠ", "↵␣␣␣␣"), ("ĊĊĠĠ", "↵↵␣␣"), ("ĠĊ", "␣↵"), ("aĠb", "a b"), ("aĠ", "a␣"),
    ("Ã©", "é"), ("Ã", "<0xC3>"), ("©", "<0xA9>"),  # "é" whole, and its two bytes split across two tokens
    ("Ġæ", "␣<0xE6>"), ("Ã©Ã", "é<0xC3>"),  # a whole character and the first byte of the next one
    ("æĹ¥", "日"), ("âĢĭ", "<U+200B>"),  # three bytes of one character; a zero-width space
    ("<|endoftext|>", "<|endoftext|>"), ("", "∅"),
])
def test_byte_level_pieces(piece, shown):
    assert readable_token(piece, BYTE_LEVEL) == shown


@pytest.mark.parametrize(("piece", "shown"), [
    ("▁the", "␣the"), ("the", "the"), ("▁", "␣"), ("<0x0A>", "↵"), ("<0x09>", "⇥"), ("<0x20>", "␣"),
    ("<0x41>", "A"), ("<0xC3>", "<0xC3>"), ("<0x0D>", "<0x0D>"), ("<s>", "<s>"), ("</s>", "</s>"),
    ("<unk>", "<unk>"),
])
def test_sentencepiece_pieces(piece, shown):
    assert readable_token(piece, SENTENCEPIECE) == shown


@pytest.mark.parametrize(("piece", "shown"), [
    ("##ing", "##ing"), ("[CLS]", "[CLS]"), ("[SEP]", "[SEP]"), ("the", "the"), ("Ġthe", "Ġthe"),
])
def test_wordpiece_keeps_its_pieces(piece, shown):
    assert readable_token(piece, WORDPIECE) == shown


def test_plain_pieces_mark_only_what_is_invisible():
    assert readable_tokens([" ", "a", "\n", "\t", "<0x0A>"], PLAIN) == ["␣", "a", "↵", "⇥", "<0x0A>"]


def test_piece_note_keeps_the_raw_piece_and_id():
    assert piece_note("Ġthe", 262) == "piece 'Ġthe', id 262"
    assert piece_note("Ċ") == "piece 'Ċ'"


# ---------------------------------------------------------------------------------------------------------------
# Every tokenizer family the tests use: its style, and its tokens read back as the text


@pytest.fixture(scope="module")
def gpt():
    """The bundled tiny GPT: byte-level BPE."""
    return load_model_dir(BUNDLED_GPT_DIR, name=BUNDLED_GPT_NAME)


@pytest.fixture(scope="module")
def sentencepiece_models(tmp_path_factory):
    """A tiny Llama with a SentencePiece tokenizer (byte fallback) trained here, read by each tokenizer class."""
    root = tmp_path_factory.mktemp("sentencepiece")
    models = {}
    for name in SENTENCEPIECE_CLASSES:
        folder = make_tiny_checkpoint("llama", root / name, with_tokenizer=False)
        write_sentencepiece_tokenizer(folder, name)
        models[name] = load_model_dir(folder)
    return models


def test_the_bundled_gpt_is_byte_level_and_reads_back_as_its_text(gpt):
    assert tokenizer_style(gpt.tokenizer) == BYTE_LEVEL
    pieces = gpt.tokenizer.tokenize(TEXT)
    assert {"Ċ", "ĉ"} <= set(pieces) and any(p.startswith("Ġ") for p in pieces)  # the cases this test is about
    shown = readable_tokens(pieces, BYTE_LEVEL)
    assert not any(mark in token for token in shown for mark in RAW_MARKS)
    assert "↵" in shown and "⇥" in shown
    assert unmarked(shown) == TEXT  # no text is lost or changed, split characters included
    split = [token for token in shown if token.startswith("<0x")]
    assert split, "the tiny vocabulary splits é and 日 into bytes"


def test_the_default_bert_is_wordpiece(bert):
    assert tokenizer_style(bert.tokenizer) == WORDPIECE
    pieces = bert.tokenizer.tokenize("Unbelievably tokenizable.")
    assert any(p.startswith("##") for p in pieces)
    assert readable_tokens(pieces, WORDPIECE) == pieces  # WordPiece's pieces already read as text


def test_tiny_checkpoints_with_the_bundled_tokenizer_are_wordpiece(tiny_checkpoint):
    assert tokenizer_style(load_model_dir(tiny_checkpoint("gpt2")).tokenizer) == WORDPIECE


@pytest.mark.parametrize("kind", ["whitespace", "bytes"])
def test_the_stand_in_tokenizers_are_plain(kind):
    tokenizer = FallbackTokenizer(kind, 1000)
    assert tokenizer_style(tokenizer) == PLAIN
    if kind == "bytes":
        assert readable_tokens(tokenizer.tokenize("a b\n"), PLAIN) == ["a", "␣", "b", "<0x0A>"]


@pytest.mark.parametrize("name", SENTENCEPIECE_CLASSES)
def test_sentencepiece_tokenizers_read_back_as_their_text(sentencepiece_models, name):
    tokenizer = sentencepiece_models[name].tokenizer
    assert tokenizer_style(tokenizer) == SENTENCEPIECE
    text = "The cat sat\non the mat."
    pieces = tokenizer.tokenize(text)
    assert any(p.startswith("▁") for p in pieces)
    shown = readable_tokens(pieces, SENTENCEPIECE)
    assert not any("▁" in token for token in shown)
    if name != "T5Tokenizer":  # T5's Unigram splits on whitespace and drops the newline
        assert "<0x0A>" in pieces and "↵" in shown
        assert unmarked(shown).lstrip(" ") == text


def test_a_slow_byte_level_tokenizer_is_read_from_its_byte_encoder():
    class SlowGPT2:
        byte_encoder = {32: "Ġ"}

        def get_vocab(self):
            return {"a": 0}

    assert tokenizer_style(SlowGPT2()) == BYTE_LEVEL


# ---------------------------------------------------------------------------------------------------------------
# Captures: raw tokens and ids kept, the readable form computed once


@pytest.fixture(scope="module")
def gpt_capture(gpt):
    return capture(gpt, TEXT)


def test_a_capture_keeps_raw_tokens_and_ids_and_reads_them_once(gpt, gpt_capture):
    result = gpt_capture
    ids = gpt.tokenizer(TEXT)["input_ids"]
    assert result.token_ids == ids
    assert result.tokens == gpt.tokenizer.convert_ids_to_tokens(ids)
    assert result.display_tokens == readable_tokens(result.tokens, BYTE_LEVEL)
    assert result.token_style == BYTE_LEVEL
    record = result.records["self"]
    assert record.query_tokens is result.tokens and record.key_tokens is result.tokens  # the filters rely on this
    assert record.query_display is result.display_tokens and record.key_display is result.display_tokens


def test_a_sentencepiece_capture_shows_marks_not_pieces(sentencepiece_models):
    result = capture(sentencepiece_models["LlamaTokenizer"], "The cat sat\non the mat.")
    assert result.tokens[0] == "<s>" and result.special[0]
    assert "<0x0A>" in result.tokens and "↵" in result.display_tokens
    assert not any("▁" in token for token in result.display_tokens)
    figure, _ = view_figure(result, ViewOptions(view="head"))
    ticks = figure.layout.xaxis.ticktext
    assert ticks[0] == "0 · &lt;s&gt;"  # Plotly would read "<s>" as strike-through markup: written as text
    assert not any("▁" in tick for tick in ticks)


def test_an_image_capture_keeps_its_patch_labels():
    from attnviz.models.record import Capture

    labels = ["[CLS]", "(0, 0)", "(0, 1)"]
    result = Capture(model_name="v", text="image", text_pair=None, tokens=labels, segments=[0] * 3, special=[True] +
                     [False] * 2)
    assert result.display_tokens is labels and result.ids_of(labels) is None


# ---------------------------------------------------------------------------------------------------------------
# Explore heads on the byte-level tiny GPT: every view readable, exports raw


def strings_of(figure) -> list[str]:
    """Every string a figure shows: tick labels, category values (the hover's token names), texts, hovers."""
    spec = figure if isinstance(figure, dict) else figure.to_plotly_json()
    found = []
    for axis_name, axis in spec["layout"].items():
        if axis_name.startswith(("xaxis", "yaxis")):
            found += [str(t) for t in axis.get("ticktext") or []]
    for trace in spec["data"]:
        for field in ("x", "y", "text", "hovertext"):
            values = trace.get(field)
            if isinstance(values, list | tuple):
                found += [str(v) for v in np.ravel(np.asarray(values, dtype=object)) if isinstance(v, str)]
    found.append(spec["layout"].get("title", {}).get("text", ""))
    return found


RAW_NOTE = re.compile(r"piece (['\"]).*?\1(, id \d+)?")  # what a hover adds on purpose: the raw piece and id


def assert_readable(strings: list[str]) -> None:
    """No token in ``strings`` is shown the tokenizer's way (the raw piece a hover adds to a token aside)."""
    raw = [s for s in strings if any(mark in RAW_NOTE.sub("", s) for mark in RAW_MARKS)]
    assert not raw, raw[:5]


@pytest.mark.parametrize("view", list(VIEWS))
def test_every_view_shows_readable_tokens(gpt_capture, view):
    figure, _ = view_figure(gpt_capture, ViewOptions(view=view, layer=1, head=1))
    strings = strings_of(figure)
    assert_readable(strings)
    if view in ("head", "lines", "average", "rollout"):
        assert any("␣cat" in s or "␣c" in s for s in strings) and any("↵" in s for s in strings)


def test_head_view_axes_and_hover_read_the_tokens(gpt_capture):
    figure, _ = view_figure(gpt_capture, ViewOptions(view="head"))
    position = gpt_capture.tokens.index("Ċ")
    label = f"{position} · ↵"
    assert label in figure.layout.yaxis.ticktext
    # the hover names a cell's query by its category: the readable label, then the raw piece and id
    hover = f"{label} (piece 'Ċ', id {gpt_capture.token_ids[position]})"
    assert hover in figure.data[0].y and hover in figure.data[0].x
    assert figure.layout.yaxis.tickvals[figure.layout.yaxis.ticktext.index(label)] == hover
    assert "%{y}" in figure.data[0].hovertemplate and "%{x}" in figure.data[0].hovertemplate


def test_no_token_of_the_bundled_gpt_hides_a_space(gpt):
    """Every token of the vocabulary reads without a space that cannot be seen: none at either end, none beside a
    newline or a tab (a line's indentation inside one token, "ĊĠĠ")."""
    tokenizer = gpt.tokenizer
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    shown = readable_tokens(pieces, BYTE_LEVEL)
    hidden = [(p, s) for p, s in zip(pieces, shown, strict=True)
              if s != s.strip(" ") or any(pair in s for pair in (" ↵", "↵ ", " ⇥", "⇥ "))]
    assert not hidden, hidden[:5]
    indented = [s for p, s in zip(pieces, shown, strict=True) if p.startswith("ĊĠ")]
    assert indented and all(s.startswith("↵␣") for s in indented)
    assert len(set(shown)) == len(set(pieces))  # no two tokens read alike


def test_lines_view_hover_adds_the_raw_piece_and_id(gpt_capture):
    figure, _ = view_figure(gpt_capture, ViewOptions(view="lines"))
    queries = next(trace for trace in figure.data if trace.name == "queries")
    position = gpt_capture.tokens.index("Ċ")
    assert queries.text[position] == f"{position} · ↵"
    assert f"piece 'Ċ', id {gpt_capture.token_ids[position]}" in queries.hovertext[position]


def test_query_key_view_reads_the_tokens_and_hovers_the_raw_piece(gpt_capture):
    record = gpt_capture.records["self"]
    position = gpt_capture.tokens.index("Ċ")
    anatomy = query_key(record, 1, 1, position, 1)
    vectors, row, caption = query_key_figures(anatomy, record, 1, 1, position, 1, gpt_capture.token_ids)
    assert_readable(strings_of(vectors) + strings_of(row) + [caption])
    assert f"q · {position} · ↵" in vectors.layout.yaxis.ticktext
    assert f"piece 'Ġcat', id {gpt_capture.token_ids[1]}" in row.data[0].customdata[1]


def test_statistics_compare_and_what_if_read_the_tokens(gpt, gpt_capture):
    table = statistics_table(gpt_capture, "self")
    assert_readable(list(table["top key"]))
    other = capture(gpt, TEXT.replace("cat", "dog"))
    figures_, _ = compare_figures(gpt_capture, other, "self", 0, 0)
    for figure in figures_:
        assert_readable(strings_of(figure))
    record = gpt_capture.records["self"]
    before, after = what_if(record, 0, None, unscaled=True)
    shown = matrices.head_heatmap(gpt_capture, record, after[0], "after")
    assert_readable(strings_of(shown))


def test_bertviz_gets_readable_tokens(gpt_capture):
    pytest.importorskip("bertviz")
    html = bertviz_html(gpt_capture, "self", "head view")
    assert "\\u0120" not in html and "Ġ" not in html  # "Ġ" (JSON-escaped or not) never reaches it
    assert "\\u2423" in html or "␣" in html


def test_exports_keep_the_raw_pieces_and_ids(gpt_capture):
    import io

    options = ViewOptions(layer=1, head=1)
    shown = shown_matrix(gpt_capture, options)
    assert "1 · ␣cat" in shown.col_labels  # the screen's labels...
    csv = matrix_csv(shown, gpt_capture, "self")
    header = csv.splitlines()[0].split(",")
    assert header[1:3] == ["0 · The", "1 · Ġcat"]  # ...the CSV keeps the tokenizer's pieces
    payload = json.loads(matrix_json(gpt_capture, options, shown))
    assert payload["query_tokens"] == gpt_capture.tokens and payload["key_ids"] == gpt_capture.token_ids
    assert payload["key_labels"] == shown.col_labels and payload["query_positions"][1] == [1, 1]
    data = np.load(io.BytesIO(capture_npz(gpt_capture)))
    assert list(data["tokens"]) == gpt_capture.tokens and list(data["token_ids"]) == gpt_capture.token_ids
    assert list(data["display_tokens"]) == gpt_capture.display_tokens


def test_pooled_exports_name_each_cells_positions_and_first_piece(gpt_capture, monkeypatch):
    monkeypatch.setattr(matrices, "POOL_LIMIT", 16)  # the tiny GPT reads 256 tokens: pool 43 to 16
    long = gpt_capture
    shown = shown_matrix(long, ViewOptions())
    assert shown.pooled_from and len(shown.row_spans) == len(shown.row_labels)
    first, last = shown.col_spans[1]
    assert shown.col_labels[1].startswith(f"{first}–{last} · ") and "Ġ" not in "".join(shown.col_labels)
    header = matrix_csv(shown, long, "self").splitlines()[0].split(",")
    assert header[2] == f"{first}–{last} · {long.tokens[first]}"


def test_bert_labels_are_unchanged(pair):
    """WordPiece reads as written: the default model's labels and exports are what they were."""
    figure, _ = view_figure(pair, ViewOptions(view="head"))
    labels = ["0 · [CLS]", "1 · the", "2 · cat"]
    assert all(f">{label}<" in text for label, text in zip(labels, figure.layout.xaxis.ticktext, strict=False))
    ids = pair.token_ids[:3]  # the hover adds only the id: the piece reads as it is shown
    assert list(figure.data[0].x[:3]) == [f"{label} (id {i})" for label, i in zip(labels, ids, strict=True)]
    assert pair.display_tokens == pair.tokens


def test_heads_and_kv_cache_cross_attention_reads_the_tokens(gpt):
    from attnviz.pagelogic.heads_kv_cache import cross_attention_caption, cross_attention_example

    example = cross_attention_example(gpt, "The cat sat on the mat.", "A kitten\nrested.")
    assert example["target_display"] == readable_tokens(example["target_tokens"], BYTE_LEVEL)
    assert "↵" in example["target_display"]
    assert_readable([cross_attention_caption(example, "identity", 1)])


def test_word_order_tokens_are_readable():
    from attnviz.interventions.word_order import word_order_experiment

    result = word_order_experiment(bundled_bert(), "The cat sat on the mat.", seed=1)
    assert result["display_tokens"] == readable_tokens(result["tokens"], WORDPIECE)


# ---------------------------------------------------------------------------------------------------------------
# The pages, as a user opens them with the bundled tiny GPT


@pytest.fixture
def _clean(clean_streamlit_caches):
    yield


SENTENCE = "The cat sat on the mat.\nIt was tired."


def test_explore_heads_on_the_tiny_gpt_shows_readable_tokens(_clean):
    at = open_page("app_pages/explore_heads.py", timeout=300, model=BUNDLED_GPT_NAME, sentence=SENTENCE)
    assert not at.exception
    main = figures(at)[0]
    ticks = main["layout"]["xaxis"]["ticktext"]
    assert "1 · ␣cat" in ticks and any(t.endswith("· ↵") for t in ticks), ticks
    assert_readable(strings_of(main))
    at.segmented_control(key="view").set_value("lines").run()
    assert not at.exception
    assert_readable(strings_of(figures(at)[0]))
    follow = at.multiselect(key="explore_follow")
    assert "1 · ␣cat" in follow.options and not any("Ġ" in option for option in follow.options)
    at.session_state["explore_tab"] = "Q·K"
    at.run()
    assert not at.exception
    query = at.selectbox(key="qk_query")
    assert not any(mark in option for option in query.options for mark in RAW_MARKS)
    for spec in figures(at):
        assert_readable(strings_of(spec))
    at.session_state["explore_tab"] = "Head statistics"
    at.run()
    assert not at.exception
    table = next(d.value for d in at.dataframe if "top key" in d.value.columns)
    assert_readable(list(table["top key"]))


@pytest.mark.parametrize("page", ["app_pages/masks.py", "app_pages/scaling.py", "app_pages/heads_kv_cache.py"])
def test_mechanism_pages_on_the_tiny_gpt_show_readable_tokens(_clean, page):
    at = open_page(page, timeout=300, model=BUNDLED_GPT_NAME, sentence=SENTENCE)
    assert not at.exception
    shown = [s for spec in figures(at) for s in strings_of(spec)]
    assert any("␣" in s for s in shown), "the page shows the tiny GPT's tokens"
    assert_readable(shown)
