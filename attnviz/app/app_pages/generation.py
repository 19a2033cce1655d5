"""Generation and KV cache: a real decoder (or encoder-decoder) writes token by token; each step's attention, the
cache it keeps, and the systems that serve it (PagedAttention, Ring attention), simulated exactly on a decoder's
own tensors."""

import contextlib
import copy
import logging

import streamlit as st

from attnviz.models.capture import capture
from attnviz.models.loading import architecture_of_folder
from attnviz.models.shipped import BUNDLED_GPT_NAME
from attnviz.pagelogic.generation import decode as gen
from attnviz.pagelogic.generation import figures as gen_figures
from attnviz.pagelogic.generation import heads as gen_heads
from attnviz.pagelogic.generation import reading as reading
from attnviz.pagelogic.generation import sequence as gen_sequence
from attnviz.pagelogic.generation import summaries as gen_summaries
from attnviz.pagelogic.generation import systems as gen_systems
from attnviz.pagelogic.generation.request import generation_key, sampling_key, sampling_of
from attnviz.ui.caches.generation import (
    cached_circuits,
    cached_fit,
    cached_float64_check,
    cached_generation,
    cached_labels,
    cached_sequence_attention,
)
from attnviz.ui.figures import figure_scale, show_figure
from attnviz.ui.frame import figure_columns, presenting, setup_area, start_page
from attnviz.ui.generation_setup import choose_decoder, request_form
from attnviz.ui.loaded_models import generation_model, load_bundle
from attnviz.ui.messages import problem_text, queries_unavailable
from attnviz.ui.open_in_explore import ask_to_open, switch_if_asked
from attnviz.ui.session_models import registered_models
from attnviz.viz.style import token_labels

TABS = ["Generation", "PagedAttention", "Ring attention"]


@contextlib.contextmanager
def working(label: str):
    """A note that says what is being computed while it is, gone once it is done, also when the work is refused
    (an exception): no box is left saying "Generating…" above a refusal."""
    placeholder = st.empty()
    placeholder.info(label, icon=":material/hourglass_top:")
    try:
        yield
    finally:
        placeholder.empty()


def run(folder: str, name: str, request: dict, seed_offset: int = 0, use_cache: bool = True) -> gen.Generation:
    return cached_generation(folder, name, request["prompt"], request["new_tokens"],
                             sampling_key(sampling_of(request, seed_offset)), use_cache, request["keep"])


def set_keep(request: dict, keep: str) -> None:
    request["keep"] = keep


def fit_notice(fit: gen.PromptFit, request: dict, tokenizer) -> None:
    """Where a prompt too long for the model's positions was cut, and the offer to keep the other end."""
    cut = gen_summaries.prompt_cut(fit, tokenizer)
    if cut is None:
        return
    say = st.warning if cut.level == "warning" else st.info
    say(cut.text, icon=":material/content_cut:")
    st.button(cut.button_label, key="gen_keep", on_click=set_keep, args=(request, cut.other_keep),
              help=cut.button_help)


def show_text(generation: gen.Generation, step: int, labels: list[str], tokenizer) -> None:
    """The prompt as read, then each generated token as a chip, the chosen step's highlighted."""
    st.html(gen_summaries.text_html(generation, step, labels, tokenizer))


def named_heads(folder: str, name: str, encoder_decoder: bool) -> dict[tuple[int, int], str]:
    """(layer, head) -> the circuit it was found to be (previous-token or induction head), for titles."""
    if encoder_decoder:
        return {}
    return {(h.layer, h.head): h.name for h in cached_circuits(folder, name) if h.found}


def head_controls(folder: str, name: str, cached: gen.Generation) -> tuple[int, int, int]:
    """The Step slider and the Layer and Head boxes; the page opens on the model's strongest induction head."""
    n_steps = len(cached.steps)
    layers, heads = cached.steps[0].attention.shape[:2]
    columns = st.columns([4, 1, 1])
    step = columns[0].slider("Step", 1, n_steps, n_steps, key="gen_step") - 1 if n_steps > 1 else 0
    if cached.encoder_decoder:
        start_layer, start_head = 0, 0
    else:  # opens on the strongest induction head: it looks back at what followed the current token before
        induction = next(h for h in cached_circuits(folder, name) if h.name == "induction head")
        start_layer, start_head = induction.layer, induction.head
    state = st.session_state
    for key, start, count in (("gen_layer", start_layer, layers), ("gen_head", start_head, heads)):
        if not 0 <= int(state.get(key, start)) < count:  # another model's layer or head
            state[key] = start
        state.setdefault(key, start)
    layer = int(columns[1].number_input("Layer", 0, layers - 1, key="gen_layer"))
    head = int(columns[2].number_input("Head", 0, heads - 1, key="gen_head"))
    return step, layer, head


def shown(figure):
    """A cached figure as :func:`show_figure` may change it: itself, or a copy in presentation mode (which scales
    the figure it is given)."""
    return copy.deepcopy(figure) if figure_scale() != 1.0 else figure


# The figures are cached by the generation's key (the objects that come with it are not hashed: "_" names).
@st.cache_resource(max_entries=32, show_spinner=False)
def next_token_figure(key: tuple, step: int, _cached: gen.Generation, _labels: list[str], _tokenizer):
    greedy = key[4][0] == "greedy"  # key[4]: the sampling key, its strategy first
    return gen_figures.next_token_figure(_cached, step, _labels, _tokenizer, greedy)


@st.cache_resource(max_entries=32, show_spinner=False)
def step_attention_figure(key: tuple, step: int, layer: int, head: int, _cached: gen.Generation,
                          _labels: list[str], _tokenizer):
    return gen_figures.step_attention_figure(_cached, step, layer, head, _labels, _tokenizer)


@st.cache_resource(max_entries=32, show_spinner=False)
def timeline_figure(key: tuple, step: int, layer: int, head: int, _cached: gen.Generation, _labels: list[str],
                    _tokenizer):
    return gen_figures.timeline_figure(_cached, step, layer, head, _labels, _tokenizer)


@st.cache_resource(max_entries=16, show_spinner=False)
def sink_figure(key: tuple, layer: int, _cached: gen.Generation):
    return gen_figures.sink_figure(_cached, layer)


@st.cache_resource(max_entries=16, show_spinner=False)
def sequence_figure(folder: str, name: str, ids: tuple[int, ...], prompt_length: int, layer: int, head: int,
                    named: str | None):
    """The chosen head over the whole sequence (one cache-free forward pass per layer, cached), and its caption."""
    weights = cached_sequence_attention(folder, name, ids, layer)[head]  # [n, n]
    return gen_figures.sequence_figure(weights, list(ids), cached_labels(folder, name, ids), prompt_length, layer,
                                       head, named, generation_model(folder, name)[1])


class ViewFailed(Exception):
    """The model generated, and a view drawn from its generation could not be (the page says which, not "could not
    generate" below figures it has drawn)."""


def generation_tab(folder: str, name: str, request: dict, model, tokenizer) -> None:
    with working("Generating with the KV cache, then again without it…"):
        cached = run(folder, name, request)
        uncached = run(folder, name, request, use_cache=False)
    try:
        generation_views(folder, name, request, tokenizer, cached, uncached)
    except ValueError:
        raise  # a refusal in words: the page's warning
    except Exception as problem:  # noqa: BLE001 - said as what it is: a view, not the generation, failed
        raise ViewFailed(problem_text(problem)) from problem


def generation_views(folder: str, name: str, request: dict, tokenizer, cached: gen.Generation,
                     uncached: gen.Generation) -> None:
    key = generation_key(folder, name, request)
    step, layer, head = head_controls(folder, name, cached)
    if not cached.encoder_decoder and not presenting():  # on a projector, below the first two charts
        circuits_section(folder, name, cached, tokenizer)
    labels = cached_labels(folder, name, tuple(cached.ids))
    show_text(cached, step, labels, tokenizer)
    left, right = figure_columns(2, key="gen_step", min_width=400)
    with left:
        figure, caption = next_token_figure(key, step, cached, labels, tokenizer)
        show_figure(shown(figure), caption, key="gen_top")
    with right:
        figure, caption = step_attention_figure(key, step, layer, head, cached, labels, tokenizer)
        show_figure(shown(figure), caption, key="gen_attention")
    if not cached.encoder_decoder and presenting():
        circuits_section(folder, name, cached, tokenizer)
    if cached.encoder_decoder:
        cross_section(folder, name, cached, step, layer, head, labels)
    else:
        sequence_section(folder, name, cached, layer, head, tokenizer)
    figure, caption = timeline_figure(key, step, layer, head, cached, labels, tokenizer)
    show_figure(shown(figure), caption, key="gen_timeline")
    figure, caption = sink_figure(key, layer, cached)
    show_figure(shown(figure), caption, key="gen_sink")
    cache_section(cached, uncached, step, *float64_check(folder, name, request))


def float64_check(folder: str, name: str, request: dict) -> tuple[tuple[bool, float] | None, str | None]:
    """The cache checked again on a float64 copy: (same tokens, largest logit difference) or None, and what made
    the copy fail, if anything."""
    float64, problem = None, None
    with working("Checking the cache again in float64…"):
        try:
            float64 = cached_float64_check(folder, name, request["prompt"], request["new_tokens"],
                                           sampling_key(sampling_of(request)), request["keep"])
        except Exception as failure:  # noqa: BLE001 - an op without a float64 kernel: the check is left out, said so
            problem = problem_text(failure)
            logging.getLogger("attnviz").warning("The float64 check failed for %s", name, exc_info=failure)
    return float64, problem


def sequence_section(folder: str, name: str, cached: gen.Generation, layer: int, head: int, tokenizer) -> None:
    """The chosen head over the whole sequence: every query of the prompt and of the generated tokens."""
    named = named_heads(folder, name, cached.encoder_decoder).get((layer, head))
    with working("Running the whole sequence once, without a cache…"):
        figure, caption = sequence_figure(folder, name, tuple(cached.ids), len(cached.prompt_ids), layer, head,
                                          named)
    show_figure(shown(figure), caption, key="gen_sequence")
    explore_button(gen_sequence.sequence_text(cached, tokenizer), name, layer, head, key="gen_explore")


def explore_button(text: str, name: str, layer: int, head: int, key: str, label: str | None = None) -> None:
    st.button(label or f"Open layer {layer}, head {head} in Explore heads", key=key, icon=":material/search:",
              on_click=ask_to_open, args=(text, name, layer, head),
              help="Explore heads with this text (the prompt as read and what was generated), this model, this "
                   "layer and head: statistics, Q·K, what-if and exports of the same head.")


def select_head(layer: int, head: int) -> None:
    """Callback: show this layer and head on the page (before the Layer and Head boxes exist)."""
    st.session_state["gen_layer"], st.session_state["gen_head"] = layer, head


def cross_section(folder: str, name: str, cached: gen.Generation, step: int, layer: int, head: int,
                  labels: list[str]) -> None:
    """An encoder-decoder's cross-attention: where each new token's query looks in the source."""
    sources = token_labels(cached_labels(folder, name, tuple(cached.source_ids)))
    show_figure(*gen_figures.cross_step_figure(cached, step, layer, head, sources), key="gen_cross")
    show_figure(*gen_figures.cross_timeline_figure(cached, layer, head, labels, sources), key="gen_cross_timeline")


def cache_section(cached: gen.Generation, uncached: gen.Generation, step: int,
                  float64: tuple[bool, float] | None, float64_problem: str | None = None) -> None:
    st.subheader("The KV cache, as the model holds it")
    st.dataframe(reading.cache_table(cached.steps[step]), hide_index=True)
    summary = gen_summaries.cache_summary(cached, uncached, step, float64, float64_problem)
    if summary.cross_note is not None:
        st.caption(summary.cross_note)
    columns = st.columns(4)
    columns[0].metric(summary.size_label, summary.size)
    columns[1].metric("Same tokens uncached", "yes" if summary.same else "no",
                      help="Whether generating without the cache (every step runs the whole sequence) gives the "
                           "same tokens.")
    columns[2].metric("Largest logit difference", summary.difference, help=summary.difference_help)
    columns[3].metric("Time per token", summary.times,
                      help="With the cache / without it: the median over the steps after the first.")
    st.caption(summary.caption)


def circuits_section(folder: str, name: str, cached: gen.Generation, tokenizer) -> None:
    """The heads the model learned (measured on its own weights), each with a button that shows it here and one
    that opens it in Explore heads."""
    if architecture_of_folder(registered_models()[name]) != "decoder":
        return  # the circuits are measured on a causal LM's own text and repeated tokens
    with st.expander("Heads this model learned", expanded=name == BUNDLED_GPT_NAME and not presenting()):
        found = cached_circuits(folder, name)
        text = gen_sequence.sequence_text(cached, tokenizer)
        for index, head in enumerate(found):
            words, show, explore = st.columns([7, 2, 3], vertical_alignment="center")
            words.markdown(head.in_words())
            where = f"layer {head.layer}, head {head.head}"
            show.button("Show here", key=f"gen_show_head_{index}", on_click=select_head,
                        args=(head.layer, head.head), help=f"Set the Layer and Head boxes of this page to {where}"
                        + ("" if head.found else " (the highest score, below the threshold)") + ".")
            with explore:
                explore_button(text, name, head.layer, head.head, key=f"gen_explore_head_{index}",
                               label="Open in Explore heads")
        st.caption("Measured now on this model's own eager attention weights, as the tests measure them. A head is "
                   f"named only when its score reaches {gen_heads.CIRCUIT_THRESHOLD:g}, the threshold Explore heads "
                   "labels heads with.")


def decoder_only(folder: str, what: str) -> bool:
    """True (with a note) for an encoder-decoder, which the simulations below do not cover."""
    if architecture_of_folder(folder) == "decoder":
        return False
    st.info(f"{what} is simulated here on a decoder's own K and V; choose a decoder (the tiny GPT, GPT-2, Llama, "
            "...) in the Model box.", icon=":material/info:")
    return True


def paged_tab(folder: str, name: str, request: dict) -> None:
    if decoder_only(folder, "PagedAttention"):
        return
    st.markdown(
        "The same prompt sampled **three times** (seeds +0, +1, +2, temperature at least 1): the real K and V "
        "of one layer, stored as vLLM's PagedAttention stores them: blocks of 16 tokens from one pool, a block "
        "table per sequence, the prompt's blocks shared until a sequence writes into one (copy-on-write)."
    )
    sampled = dict(request, strategy="sample", temperature=max(1.0, request["temperature"]))
    with working("Sampling the prompt three times…"):
        samples = [run(folder, name, sampled, seed_offset=offset) for offset in range(3)]
    layers = len(samples[0].kv)
    layer = int(st.number_input("Layer", 0, layers - 1, 0, key="gen_paged_layer"))
    model, _ = generation_model(folder, name)
    max_length = gen.context_length(model.config)
    try:
        demo = gen_systems.paged_demo(samples, layer, max_length=max_length, seed=request["seed"])
    except ValueError as problem:  # a sliding layer's cache has dropped the oldest tokens
        st.info(gen_summaries.sliding_refusal(problem, samples[0]), icon=":material/info:")
        return
    for (figure, caption), key in zip(gen_figures.paged_figures(demo), ("gen_block_table", "gen_memory_map"),
                                      strict=True):
        show_figure(figure, caption, key=key)
    for column, (label, value, help_text) in zip(st.columns(4), gen_summaries.paged_metrics(demo, max_length),
                                                 strict=True):
        column.metric(label, value, help=help_text)
    st.caption(gen_summaries.paged_caption(demo, layer, max_length))


def ring_tab(folder: str, name: str, request: dict) -> None:
    if decoder_only(folder, "Ring attention"):
        return
    generation = run(folder, name, request)
    model, tokenizer = generation_model(folder, name)
    text = gen_sequence.sequence_text(generation, tokenizer)
    bundle = load_bundle(folder, name)
    record = capture(bundle, text).records["self"]
    if queries_unavailable(bundle, record, "Ring attention on the model's own Q, K and V"):
        return
    columns = st.columns([3, 1])
    devices = int(columns[0].slider("Devices P", 2, min(8, record.n_q), min(4, record.n_q), key="gen_devices"))
    layer = int(columns[1].number_input("Layer", 0, record.n_layers - 1, 0, key="gen_ring_layer"))
    difference, trace = gen_systems.ring_demo(record, layer, devices, causal=True)
    st.markdown(gen_summaries.ring_statement(record.n_q, devices, difference, layer))
    show_figure(*gen_figures.ring_trace_figure(trace), key="gen_ring")
    shape = (record.n_heads, record.n_kv_heads, record.queries.shape[-1])  # heads, K/V heads, head dim
    st.dataframe(gen_summaries.ring_memory_rows(record.n_q, *shape), hide_index=True)
    st.caption(gen_summaries.ring_memory_caption(*shape))


def main() -> None:
    switch_if_asked()
    start_page("Generation and KV cache")
    with setup_area("Model, prompt and decoding"):  # on a projector, the generation itself comes first
        choice = choose_decoder()
        if choice is None:
            return
        name, folder = choice
        request = request_form()
    try:
        model, tokenizer = generation_model(folder, name)
    except Exception as problem:  # noqa: BLE001 - refused with a reason, or anything else: said in words
        st.error(f"{name} cannot generate here: {problem_text(problem)}. Choose another decoder.",
                 icon=":material/error:")
        return
    try:
        fit_notice(cached_fit(folder, name, request["prompt"], request["new_tokens"], request["keep"]), request,
                   tokenizer)
        tabs = dict(zip(TABS, st.tabs(TABS, key="gen_tab", on_change="rerun", bind="query-params"), strict=True))
        bodies = {"Generation": lambda: generation_tab(folder, name, request, model, tokenizer),
                  "PagedAttention": lambda: paged_tab(folder, name, request),
                  "Ring attention": lambda: ring_tab(folder, name, request)}
        for title, body in bodies.items():
            if tabs[title].open:
                with tabs[title]:
                    body()
    except ValueError as problem:
        text = str(problem)
        st.warning(text[:1].upper() + text[1:], icon=":material/warning:")
    except ViewFailed as problem:
        st.error(f"{name} generated, but a view of its generation could not be drawn: {problem}.",
                 icon=":material/error:")
    except Exception as problem:  # noqa: BLE001 - whatever a checkpoint's code raises, said in words
        st.error(f"{name} could not generate from this prompt: {problem_text(problem)}.", icon=":material/error:")


main()
