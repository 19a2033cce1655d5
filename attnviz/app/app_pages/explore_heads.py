"""Explore heads: what every head of a real pretrained model attends to, for any sentence."""

import streamlit as st

from attnviz.core import vision
from attnviz.core.units import human_bytes
from attnviz.pagelogic.clicks import customdata_numbers, selected_points
from attnviz.pagelogic.explore_heads.grid import filtered_thumbnails, has_thumbnails, labels_heads
from attnviz.pagelogic.explore_heads.images import IMAGE_SOURCES, IMAGE_TABS, image_summary, upload_key
from attnviz.pagelogic.explore_heads.long_texts import sample_text
from attnviz.pagelogic.explore_heads.matrices import POOL_LIMIT
from attnviz.pagelogic.explore_heads.options import KIND_NAMES, VIEWS, ViewOptions, automatic_scale_note
from attnviz.pagelogic.explore_heads.setup_notes import (
    pair_field,
    replay_button_label,
    replay_verdict,
    replay_waits,
    truncation_note,
)
from attnviz.pagelogic.explore_heads.statistics import has_statistics, statistics_table
from attnviz.pagelogic.explore_heads.views import view_figure, zoom_figure
from attnviz.ui.caches.explore_heads import cached_replay_difference
from attnviz.ui.captures import cached_image_capture, capture_current
from attnviz.ui.explore_controls import (
    VIEW_CONTROL_KEYS,
    colour_control,
    filter_controls,
    head_control,
    keep_hidden_choices,
    layer_control,
    layer_fields,
    lines_controls,
    open_head,
    pooling_controls,
    requested_view,
)
from attnviz.ui.explore_tabs import (
    bertviz_tab,
    compare_tab,
    current_head_options,
    export_tab,
    image_tab,
    query_key_tab,
    statistics_tab,
    what_if_tab,
)
from attnviz.ui.figures import show_figure
from attnviz.ui.frame import setup_area, start_page, transient_status
from attnviz.ui.messages import problem_text, warn_if_not_finite
from attnviz.ui.session_models import current_bundle, current_model_name, model_dtype, registered_models
from attnviz.ui.sidebar import current_sentence
from attnviz.viz.heads import head_sharing

TEXT_SOURCES = ["the sidebar's sentence", "a long text", "Python's documentation"]
SAMPLE_LENGTHS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
MAX_LONG_TEXT_BYTES = 2_000_000
TABS = ["View", "Head statistics", "Q·K", "Compare two sentences", "What-if", "bertviz (online)", "Export"]


def run_open_tab(tabs: dict, bodies: dict) -> None:
    """Only the open tab computes: run its body inside it."""
    for title, body in bodies.items():
        if tabs[title].open:
            with tabs[title]:
                body()


def on_figure_click() -> None:
    """Callback of the grid and lines views: a click on a thumbnail opens that head; on a query token, follows it."""
    for point in selected_points(st.session_state.get("explore_main_figure")):
        numbers = customdata_numbers(point.get("customdata"))
        if numbers is not None and len(numbers) == 2:  # a grid thumbnail: (layer, head)
            open_head(*numbers)
            return
        if numbers is not None and len(numbers) == 1:  # a query token of the lines view: follow it, or stop
            position = numbers[0]
            following = st.session_state.get("explore_follow", [])
            st.session_state["explore_follow"] = [] if following == [position] else [position]
            return


def replay_check(capture_key: tuple, kind: str, record, model) -> None:
    if not record.replayable:
        return  # the eager-weights path: nothing to replay (the page's note says so)
    asked = st.session_state.get("explore_replay_asked") == (capture_key, kind)
    if replay_waits(record) and not asked:
        st.button(
            replay_button_label(record), key="explore_replay_button", on_click=lambda: st.session_state.update(
                explore_replay_asked=(capture_key, kind)),
            help="Recomputes every head with attnviz's attention and compares weights @ V with the model's output.",
        )
        return
    with transient_status("Replay check: recomputing every layer with attnviz's attention…") as status:
        difference = cached_replay_difference(
            capture_key, kind, record,
            _progress=lambda layer, n: status.update(label=f"Replay check: layer {layer + 1} of {n}…"), _model=model,
        )
    verdict, why = replay_verdict(difference, record)
    st.markdown(verdict, help=why)


def view_options(capture, record, kind: str, text_pair: str, architecture: str) -> ViewOptions:
    """The controls above the tabs, as one ViewOptions: only those that act on the chosen view are drawn."""
    keep_hidden_choices("layer", "head", *VIEW_CONTROL_KEYS)
    asked = requested_view()
    controls = st.columns([2, 2, 6, 3])
    layer = layer_control(controls[0], record, asked)
    head = head_control(controls[1], record, asked)
    view = controls[2].segmented_control(
        "View", list(VIEWS), format_func=VIEWS.get, default="head", key="view", required=True,
        bind="query-params",
    )
    filters = st.columns([3, 3, 2, 4])
    fields = {**layer_fields(view, layer), **filter_controls(filters, kind, text_pair, architecture)}
    if view == "lines":
        fields.update(lines_controls(filters[3], record, head))
    fields.update(colour_control(controls[3], view, record))
    if view in ("head", "average") and max(record.n_q, record.n_k) > POOL_LIMIT:
        fields.update(pooling_controls(record))
    return ViewOptions(kind=kind, head=head, view=view, **fields)


def prepare_grid(capture, record, options: ViewOptions) -> None:
    """The grid's slow parts, each computed once per record with its progress shown: every head's thumbnails, and
    the head statistics its labels come from."""
    if not has_thumbnails(capture, record, options):
        with transient_status("Pooling every head into thumbnails…") as status:
            filtered_thumbnails(capture, record, options, progress=lambda layer, n: status.update(
                label=f"Pooling every head into thumbnails: layer {layer + 1} of {n}…"))
    if labels_heads(record) and not has_statistics(record):
        with transient_status("Labelling every head…") as status:
            statistics_table(capture, options.kind, progress=lambda layer, n: status.update(
                label=f"Labelling every head: layer {layer + 1} of {n}…"))


def view_tab(capture, record, options: ViewOptions) -> None:
    try:
        if options.view == "grid":
            prepare_grid(capture, record, options)
        figure, caption = view_figure(capture, options)
    except ValueError as problem:
        st.warning(str(problem))
    else:
        show_figure(figure, caption, key="explore_main_figure",
                    on_select=on_figure_click if options.view in ("grid", "lines") else None)
        if options.automatic_scale and options.view in ("head", "average", "rollout"):
            note = automatic_scale_note(record.n_q, record.n_k)
            if note:
                st.caption(note)
        if options.view in ("head", "average") and max(record.n_q, record.n_k) > POOL_LIMIT:
            zoom, zoom_caption = zoom_figure(capture, options)
            show_figure(zoom, zoom_caption, key="explore_zoom_figure")
    if record.n_kv_heads != record.n_heads:
        show_figure(
            head_sharing(record.n_heads, record.n_kv_heads,
                         title=f"{record.n_heads} query heads share {record.n_kv_heads} K/V heads"),
            "Grouped-query attention: heads of one colour read the same keys and values (their queries differ).",
            key="explore_sharing",
        )


def text_source(bundle) -> tuple[str, int | None]:
    """The text to explore: the sidebar's sentence, a long text pasted or uploaded, or Python's documentation
    (which ships with Python: a long text offline). Returns the text and a token limit (None: the model's)."""
    source = st.segmented_control(
        "Text", TEXT_SOURCES, default=TEXT_SOURCES[0], key="explore_source", required=True, bind="query-params",
        help="Long texts: attnviz replays attention on demand, pools large heatmaps and zooms into any window.",
    )
    if source == TEXT_SOURCES[1]:
        uploaded = st.file_uploader("A .txt file (UTF-8), or paste below", type=["txt"], key="explore_long_file",
                                    max_upload_size=max(1, -(-MAX_LONG_TEXT_BYTES // 1024**2)))
        if uploaded is not None:
            data = uploaded.getvalue()
            if len(data) > MAX_LONG_TEXT_BYTES:
                st.error(f"That file is {len(data) / 1e6:.1f} MB; paste or upload at most "
                         f"{MAX_LONG_TEXT_BYTES // 10**6} MB of text.")
                st.stop()
            return data.decode("utf-8", errors="replace"), None
        pasted = st.text_area("Long text", key="explore_long_text", height=160, max_chars=MAX_LONG_TEXT_BYTES,
                              placeholder="Paste a long text: an article, a chapter, code…")
        return pasted or current_sentence(), None
    if source == TEXT_SOURCES[2]:
        lengths = [n for n in SAMPLE_LENGTHS if n <= bundle.max_positions] or [bundle.max_positions]
        tokens = st.select_slider("Tokens", lengths, min(1024, lengths[-1]), key="explore_sample_tokens",
                                  bind="query-params", help="The first tokens of Python's own documentation.")
        return sample_text(), int(tokens)
    return current_sentence(), None


@st.cache_resource(max_entries=2, show_spinner=False)
def sample_photo(name: str):
    return vision.sample_image(name)


def image_source() -> tuple[str, object, str]:
    """The image to explore: one of scikit-learn's sample photos (offline) or an upload, validated. Returns a key
    for the cache, the RGB image and its name."""
    columns = st.columns([2, 3])
    source = columns[0].segmented_control("Image", IMAGE_SOURCES, default=IMAGE_SOURCES[0], required=True,
                                          key="explore_image_source")
    if source == IMAGE_SOURCES[1]:
        uploaded = columns[1].file_uploader("A PNG or JPEG", type=["png", "jpg", "jpeg"], key="explore_image_file",
                                            max_upload_size=vision.MAX_IMAGE_BYTES // 1024**2,
                                            help=f"Up to {human_bytes(vision.MAX_IMAGE_BYTES)} and "
                                                 f"{vision.MAX_IMAGE_PIXELS / 1e6:.0f} megapixels.")
        if uploaded is None:
            st.info("Upload a PNG or JPEG to see where this model's heads look.", icon=":material/upload:")
            st.stop()
        data = uploaded.getvalue()
        try:
            image = vision.read_image(data)
        except vision.ImageRefused as problem:
            st.error(f"This image cannot be read: {problem}.", icon=":material/broken_image:")
            st.stop()
        return upload_key(data), image, uploaded.name
    name = columns[1].selectbox("Sample photo", list(vision.SAMPLE_IMAGES), key="explore_image_sample")
    return "sample:" + name, sample_photo(name), name


def image_main(bundle) -> None:
    """Explore heads for a vision transformer: an image picker instead of the sentence box, an overlay view."""
    if bundle.tokenizer_note:  # the image processor's stand-in
        st.warning(bundle.tokenizer_note, icon=":material/warning:")
    image_key, image, image_name = image_source()
    name = current_model_name()
    folder = registered_models()[name]
    try:
        capture = cached_image_capture(folder, name, model_dtype(name), image_key, bundle, image, image_name)
    except Exception as problem:  # noqa: BLE001 - whatever a checkpoint's code raises, said in words
        st.error(f"{name} could not run on this image: {problem_text(problem)}. Try another image, or choose another "
                 "model in the sidebar.", icon=":material/error:")
        st.stop()
    warn_if_not_finite(bundle, capture)
    capture_key = (folder, name, model_dtype(name), image_key)
    st.caption(image_summary(name, bundle.describe(), capture))
    record = capture.records["self"]
    replay_check(capture_key, "self", record, bundle.model)
    tabs = dict(zip(IMAGE_TABS, st.tabs(IMAGE_TABS, key="explore_image_tab", on_change="rerun"), strict=True))

    def options() -> ViewOptions:  # the views' controls, drawn in the tabs that use them
        return view_options(capture, record, "self", "", bundle.architecture)

    bodies = {
        "Image": lambda: image_tab(capture),
        "View": lambda: view_tab(capture, record, options()),
        "Head statistics": lambda: statistics_tab(capture, capture_key, "self", current_head_options()),
        "Export": lambda: export_tab(capture, record, options()),
    }
    run_open_tab(tabs, bodies)


def main() -> None:
    start_page("Explore heads")
    bundle = current_bundle()
    if bundle.modality == "image":
        image_main(bundle)
        return
    if bundle.uses_fallback_tokenizer:
        st.warning(bundle.tokenizer_note, icon=":material/warning:")
        st.radio(
            "Stand-in tokenizer (this checkpoint has none)", ["whitespace", "bytes"], horizontal=True,
            key="fallback_tokenizer", help="Whitespace: one token per word. Bytes: one token per UTF-8 byte.",
        )
    setup = setup_area("Text, model and replay check")
    with setup:
        source_column, pair_column = st.columns([6, 4])
        with source_column:
            text, max_tokens = text_source(bundle)
        pair_label, pair_help = pair_field(bundle.architecture)
        text_pair = pair_column.text_input(pair_label, key="explore_pair", max_chars=2000, help=pair_help,
                                           bind="query-params")
        bundle, capture, capture_key = capture_current(text, text_pair, max_tokens, notice=False)
        name = current_model_name()
        st.caption(f"**{name}** · {bundle.describe()}")
        if bundle.capture_note:
            st.info(bundle.capture_note, icon=":material/route:")
    cut = truncation_note(capture, bundle.max_positions, max_tokens)
    if cut is not None:
        st.warning(cut, icon=":material/content_cut:")
    kind = capture.kinds[0]
    if len(capture.kinds) > 1:
        kind = st.segmented_control("Attention", capture.kinds, default=capture.kinds[0],
                                    format_func=KIND_NAMES.get, key="explore_kind", required=True)
    record = capture.records[kind]
    with setup:
        replay_check(capture_key, kind, record, bundle.model)
    options = view_options(capture, record, kind, text_pair, bundle.architecture)

    tabs = dict(zip(TABS, st.tabs(TABS, key="explore_tab", on_change="rerun", bind="query-params"), strict=True))
    with tabs["View"]:
        view_tab(capture, record, options)
    bodies = {
        "Head statistics": lambda: statistics_tab(capture, capture_key, kind, options),
        "Q·K": lambda: query_key_tab(bundle, capture, record, options),
        "Compare two sentences": lambda: compare_tab(capture, text, text_pair, options, max_tokens),
        "What-if": lambda: what_if_tab(bundle, capture, record, options),
        "bertviz (online)": lambda: bertviz_tab(capture, kind),
        "Export": lambda: export_tab(capture, record, options),
    }
    run_open_tab(tabs, bodies)


main()
