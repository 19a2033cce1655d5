"""Generation and KV cache: a real decoder (or encoder-decoder) writes token by token; each step's attention, the
cache it keeps, and the systems that serve it (PagedAttention, Ring attention), simulated exactly on a decoder's
own tensors."""

import contextlib
import copy
import html
import logging
import statistics

import streamlit as st

from attnviz.core.tokens_display import markdown_literal
from attnviz.core.units import human_bytes
from attnviz.flash.ring import ring_memory
from attnviz.models.capture import capture
from attnviz.models.loading import BUNDLED_GPT_NAME, architecture_of_folder
from attnviz.pagelogic.generation import decode as gen
from attnviz.pagelogic.generation import heads as gen_heads
from attnviz.pagelogic.generation import reading as reading
from attnviz.pagelogic.generation import sequence as gen_sequence
from attnviz.pagelogic.generation import systems as gen_systems
from attnviz.ui.caches.generation import (
    REQUEST_DEFAULTS,
    cached_circuits,
    cached_fit,
    cached_float64_check,
    cached_generation,
    cached_labels,
    cached_sequence_attention,
)
from attnviz.ui.figures import figure_scale, show_figure
from attnviz.ui.frame import figure_columns, presenting, setup_area, start_page
from attnviz.ui.loaded_models import generation_model, load_bundle
from attnviz.ui.messages import problem_text, queries_unavailable
from attnviz.ui.open_in_explore import ask_to_open, switch_if_asked
from attnviz.ui.session_models import current_model_name, registered_models
from attnviz.viz.charts import bar_chart, line_chart
from attnviz.viz.generation import next_token_chart, sequence_heatmap
from attnviz.viz.inference import block_table_figure, memory_map_figure, ring_figure
from attnviz.viz.matrix import NARROW_FULL_WIDTH, matrix_heatmap
from attnviz.viz.style import token_labels

TABS = ["Generation", "PagedAttention", "Ring attention"]
MAX_NEW_TOKENS = 64
MAX_PROMPT_CHARS = 200_000  # a bound on what the box holds; the model reads what its positions allow (fit_prompt)


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


GENERATES = ("decoder", "encoder-decoder")


def choose_decoder() -> tuple[str, str] | None:
    """The model this page runs: the sidebar's model when it generates (a decoder or an encoder-decoder), else the
    bundled tiny GPT."""
    models = registered_models()
    decoders = {name: folder for name, folder in models.items() if architecture_of_folder(folder) in GENERATES}
    if not decoders:
        st.warning("No decoder is loaded: add one (GPT-2, Llama, T5, BART, ...) on the Checkpoints page.")
        return None
    sidebar = current_model_name()
    if sidebar not in decoders:
        kind = architecture_of_folder(models[sidebar]) or "not a decoder"
        st.info(f"The sidebar's model, **{sidebar}**, is an {kind}: it reads a whole text at once and does not "
                "generate. This page runs a decoder or an encoder-decoder.", icon=":material/info:")
    default = sidebar if sidebar in decoders else (BUNDLED_GPT_NAME if BUNDLED_GPT_NAME in decoders
                                                   else next(iter(decoders)))
    names = list(decoders)
    name = st.selectbox("Model", names, index=names.index(default), key="gen_model",
                        format_func=lambda n: f"{n} ({architecture_of_folder(decoders[n])})")
    return name, decoders[name]


def the_request() -> dict:
    """The settings in use (applied by the Generate button), kept in the session."""
    request = st.session_state.setdefault("gen_request", dict(REQUEST_DEFAULTS))
    for key, value in REQUEST_DEFAULTS.items():  # a request from an older session, or a test, may lack a setting
        request.setdefault(key, value)
    return request


def doubled(prompt: str) -> str:
    """The prompt typed twice: the second copy after a space, unless the first ends with a space or a newline."""
    return prompt + ("" if not prompt or prompt[-1].isspace() else " ") + prompt


def apply_form(repeat: bool = False) -> None:
    """Callback of the form's buttons (the form's values are in the session by now): the settings become the
    request; "Repeat my prompt" doubles the prompt first (in the box too)."""
    state = st.session_state
    prompt = state["gen_prompt"]
    if repeat:
        prompt = doubled(prompt)
        state["gen_prompt"] = prompt
    state["gen_request"].update(
        prompt=prompt, new_tokens=int(state["gen_count"]), strategy=state["gen_strategy"],
        temperature=float(state["gen_temperature"]), top_k=int(state["gen_top_k"]), top_p=float(state["gen_top_p"]),
        seed=int(state["gen_seed"]))


def request_form() -> dict:
    """The generation's settings, applied with the Generate button (so typing never reruns the model). The
    decoding choice is outside the form, so that the sampling controls are enabled at once when sampling is
    chosen (and greyed out under greedy decoding, where they change nothing)."""
    request = the_request()
    choice, top_k_column = st.columns([3, 1])
    strategy = choice.radio("Decoding", list(gen.STRATEGIES), format_func=gen.STRATEGIES.get,
                            index=list(gen.STRATEGIES).index(request["strategy"]), key="gen_strategy",
                            horizontal=True,
                            help="Applied with Generate. Greedy takes the most likely token; sampling draws from the "
                                 "distribution shaped by temperature, top-k and top-p, with the seed.")
    greedy = strategy == "greedy"
    off = " Greedy decoding ignores it: choose sampling to use it." if greedy else ""
    # Top-k is outside the form too: top-k 1 keeps only the most likely token, the draw is greedy, and temperature,
    # top-p and seed (greyed out at once) change nothing.
    top_k = top_k_column.number_input(
        "Top-k (0: off)", 0, 1000, request["top_k"], key="gen_top_k", disabled=greedy,
        help="Sampling only, applied with Generate: keep the k most likely tokens (1: the most likely, as greedy)."
             + off)
    only_one = not greedy and top_k == 1
    if only_one:
        off = " Top-k 1 keeps only the most likely token, so the draw is greedy: raise top-k to use it."
    with st.form("gen_form", border=False):
        # The widgets start from the settings in use (after a visit to another page they are drawn afresh).
        st.text_area(
            "Prompt", request["prompt"], key="gen_prompt", max_chars=MAX_PROMPT_CHARS, height=110,
            help="Any length, line breaks kept: the model reads as many tokens as its positions hold (with room "
                 "for the new tokens); a longer prompt is cut, and the page says where.")
        columns = st.columns([2, 3, 3, 2])
        columns[0].number_input("New tokens", 1, MAX_NEW_TOKENS, request["new_tokens"], key="gen_count")
        columns[1].slider("Temperature", 0.1, 2.0, request["temperature"], 0.1, key="gen_temperature",
                          disabled=greedy or only_one,
                          help="Sampling only: logits are divided by it before the softmax." + off)
        columns[2].slider("Top-p", 0.05, 1.0, request["top_p"], 0.05, key="gen_top_p", disabled=greedy or only_one,
                          help="Sampling only: keep the most likely tokens until their mass reaches p." + off)
        columns[3].number_input("Seed", 0, 10_000, request["seed"], key="gen_seed", disabled=greedy or only_one,
                                help="Sampling only: the random draws, repeatable." + off)
        buttons = st.columns([1, 2, 5])
        buttons[0].form_submit_button("Generate", type="primary", on_click=apply_form)
        buttons[1].form_submit_button(
            "Repeat my prompt", on_click=apply_form, args=(True,),
            help="Types the prompt twice, then generates. In the whole-sequence view below, an induction head sends "
                 "each token of the second copy to the token that followed it in the first.")
    if strategy != request["strategy"]:
        st.caption(":material/info: Press **Generate** to decode "
                   + ("greedily." if greedy else "by sampling (temperature, top-k, top-p, seed)."))
    st.button("One more token", key="gen_more", on_click=lambda: request.update(
        new_tokens=min(MAX_NEW_TOKENS, request["new_tokens"] + 1)), help="The same generation, one step longer.")
    return request


def sampling_of(request: dict, seed_offset: int = 0) -> gen.Sampling:
    return gen.Sampling(request["strategy"], request["temperature"], request["top_k"], request["top_p"],
                        request["seed"] + seed_offset)


def sampling_key(sampling: gen.Sampling) -> tuple:
    return (sampling.strategy, sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed)


def run(folder: str, name: str, request: dict, seed_offset: int = 0, use_cache: bool = True) -> gen.Generation:
    return cached_generation(folder, name, request["prompt"], request["new_tokens"],
                             sampling_key(sampling_of(request, seed_offset)), use_cache, request["keep"])


def set_keep(request: dict, keep: str) -> None:
    request["keep"] = keep


def snippet(text: str, end: bool, chars: int = 40) -> str:
    """At most ``chars`` characters of ``text`` (its end, or its start), cut at a space, on one line."""
    text = " ".join(text.split())
    if len(text) <= chars:
        return text
    part = text[-chars:] if end else text[:chars]
    cut = part.split(" ", 1)[1] if end and " " in part else (part.rsplit(" ", 1)[0] if " " in part else part)
    return cut


def fit_notice(fit: gen.PromptFit, request: dict, tokenizer) -> None:
    """Where a prompt too long for the model's positions was cut, and the offer to keep the other end."""
    if not fit.truncated:
        return
    room = f"this model has {fit.positions:,} positions" + (
        f" and {fit.new_tokens} go to the new tokens" if fit.room < fit.positions else "")
    if fit.keep == "first":
        tail = markdown_literal(snippet(gen_sequence.whole_characters(tokenizer, fit.ids[-24:]), end=True))
        st.warning(f"The prompt has {fit.total:,} tokens; {room}, so it reads the first {fit.room:,} (up to "
                   f"“…{tail}”) and continues from there, as Explore heads reads a long text from its start.",
                   icon=":material/content_cut:")
        other, label = "latest", f"Keep only the latest {fit.room:,} tokens"
        why = "The model then continues from the end of your text; the first tokens are left out."
    else:
        head = markdown_literal(snippet(gen_sequence.whole_characters(tokenizer, fit.ids[:24]), end=False))
        st.info(f"The prompt has {fit.total:,} tokens; {room}, so it reads the latest {fit.room:,} (from "
                f"“{head}…”): the first {fit.dropped:,} are left out.", icon=":material/content_cut:")
        other, label = "first", f"Keep the first {fit.room:,} tokens instead"
        why = "As Explore heads reads a long text: from its start."
    st.button(label, key="gen_keep", on_click=set_keep, args=(request, other), help=why)


def show_text(generation: gen.Generation, step: int, labels: list[str], tokenizer) -> None:
    """The prompt as the model read it, then each generated token as a chip with visible marks (a space ␣, a
    newline ↵, a byte <0xNN>), the chosen step's token highlighted; for an encoder-decoder, the source the encoder
    read, then what the decoder wrote after its start token."""
    n_prompt = len(generation.prompt_ids)
    if generation.encoder_decoder:
        source = tokenizer.decode(generation.source_ids, skip_special_tokens=True)
        parts = [f'<span style="color:#555">{html.escape(source)}</span> → ']
    else:  # decoded whole: SentencePiece's spaces and byte-level BPE's multi-byte characters as they read
        parts = [html.escape(tokenizer.decode(generation.prompt_ids, skip_special_tokens=False))]
    for index, label in enumerate(labels[n_prompt:]):
        background = "#ffe0b2" if index == step else "#fff7ed"
        token_id = generation.steps[index].token_id
        parts.append(f'<b title="step {index + 1}, token id {token_id}" style="color:#c2410c; background:'
                     f'{background}; border:1px solid #fdba74; border-radius:4px; padding:0 3px; margin:0 1px; '
                     f'white-space:pre">{html.escape(label)}</b>')
    st.html('<div style="font-size:1.1rem; line-height:1.8; white-space:pre-wrap; max-height:16rem; '
            f'overflow-y:auto">{"".join(parts)}</div>')


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


def generation_key(folder: str, name: str, request: dict) -> tuple:
    """What a generation depends on: the figures drawn from it are cached by this and their own settings."""
    return (folder, name, request["prompt"], request["new_tokens"], sampling_key(sampling_of(request)),
            request["keep"])


def shown(figure):
    """A cached figure as :func:`show_figure` may change it: itself, or a copy in presentation mode (which scales
    the figure it is given)."""
    return copy.deepcopy(figure) if figure_scale() != 1.0 else figure


@st.cache_resource(max_entries=32, show_spinner=False)
def next_token_figure(key: tuple, step: int, _cached: gen.Generation, _labels: list[str], _tokenizer):
    chosen = _cached.steps[step]
    bar_labels, probabilities, ids = gen_sequence.top_token_bars(_tokenizer, chosen.top)
    taken = _labels[len(_cached.prompt_ids) + step]
    figure = next_token_chart(bar_labels, probabilities, ids, chosen=chosen.token_id,
                              pieces=gen_sequence.raw_pieces(_tokenizer, ids),
                              title=f"Step {step + 1}: next-token distribution,<br>the {len(ids)} most likely")
    greedy = key[4][0] == "greedy"
    caption = ((f"The model's {len(ids)} most likely next tokens; greedy takes the first: " if greedy else
                f"The {len(ids)} most likely tokens of the distribution the token was drawn from (after temperature, "
                "top-k and top-p); chosen: ") + f"**{markdown_literal(taken)}** (orange). Marks: ␣ a space, ↵ a "
               "newline, <0xNN> a byte "
               "that is part of a character; #id where two tokens read alike.")
    return figure, caption


@st.cache_resource(max_entries=32, show_spinner=False)
def step_attention_figure(key: tuple, step: int, layer: int, head: int, _cached: gen.Generation,
                          _labels: list[str], _tokenizer):
    chosen = _cached.steps[step]
    what = "decoder self-attention" if _cached.encoder_decoder else "attention"
    window = reading.window_statement(_cached, step, layer)
    figure = bar_chart(token_labels(_labels[: chosen.position]), chosen.attention[layer, head].tolist(),
                       title=f"Step {step + 1}: {what} of layer {layer}, head {head}", y_title="weight",
                       notes=gen_sequence.piece_notes(_tokenizer, _cached.ids[: chosen.position]))
    caption = ("The weights of the query that predicted this token (the last token read) over every earlier token"
               + (" of the decoder (its start token, then what it wrote)" if _cached.encoder_decoder else "")
               + f"; {reading.row_sum_statement(_cached, step, layer, head)}." + (f" {window}" if window else ""))
    return figure, caption


@st.cache_resource(max_entries=32, show_spinner=False)
def timeline_figure(key: tuple, step: int, layer: int, head: int, _cached: gen.Generation, _labels: list[str],
                    _tokenizer):
    sliding = layer < len(_cached.layers) and _cached.layers[layer].sliding
    matrix = reading.timeline(_cached, layer, head)[: step + 1]  # [steps so far, positions]: it grows with the Step
    written = _cached.steps[: step + 1]
    n_prompt = len(_cached.prompt_ids)
    rows = token_labels(_labels[n_prompt: n_prompt + step + 1], [s.position for s in written])
    notes = gen_sequence.piece_notes(_tokenizer, _cached.ids)  # the hover adds each token's raw piece and id
    figure = matrix_heatmap(matrix, rows, token_labels(_labels),
                            title=f"Timeline: each step's attention, layer {layer}, head {head}",
                            x_title="key position", y_title="generated token", show_values=False,
                            width=NARROW_FULL_WIDTH,  # its key labels thinned to fit a 900-px window too
                            row_notes=notes[n_prompt: n_prompt + step + 1], col_notes=notes)
    caption = (f"One row per generated token up to step {step + 1} (labelled by its position): its query's weights "
               "over the earlier tokens, each at its position. Grey: keys the query did not read, positions that did "
               "not exist yet" + (f" and keys out of layer {layer}'s sliding window of "
                                  f"{_cached.layers[layer].window:,} tokens" if sliding else "")
               + ". Move the Step slider to watch it build up.")
    return figure, caption


@st.cache_resource(max_entries=16, show_spinner=False)
def sink_figure(key: tuple, layer: int, _cached: gen.Generation):
    sink = reading.sink_mass(_cached)[:, layer]  # [steps, heads]
    leaves = reading.first_token_leaves(_cached, layer)
    figure = line_chart(list(range(1, len(_cached.steps) + 1)),
                        {f"head {h}": sink[:, h].tolist() for h in range(sink.shape[1])},
                        title=f"Attention-sink mass: share on the first token, layer {layer}", x_title="step",
                        y_title="weight on token 0", markers=True)
    caption = ("Many decoders park attention on the first token when nothing else is relevant (Xiao et al., 2023): a "
               "head that keeps a large share there is a sink."
               + (" Here the first token is the decoder's start token; at step 1 it is the only key, so every head "
                  "puts 1 on it." if _cached.encoder_decoder else "")
               + (f" From step {leaves} on, token 0 is out of layer {layer}'s sliding window of "
                  f"{_cached.layers[layer].window:,} tokens: no query reads it, so its share is 0." if leaves else ""))
    return figure, caption


@st.cache_resource(max_entries=16, show_spinner=False)
def sequence_figure(folder: str, name: str, ids: tuple[int, ...], prompt_length: int, layer: int, head: int,
                    named: str | None):
    """The chosen head over the whole sequence (one cache-free forward pass per layer, cached), and its caption."""
    weights = cached_sequence_attention(folder, name, ids, layer)[head]  # [n, n]
    view = gen_sequence.sequence_view(weights, list(ids), cached_labels(folder, name, ids), prompt_length)
    title = (f"Layer {layer}, head {head}{f' ({named})' if named else ''} over the whole sequence: every query, "
             "prompt and generated")
    if view.pooled:
        title += f"<br><sup>{view.n:,} x {view.n:,} max-pooled to {len(view.labels)} x {len(view.labels)}</sup>"
    notes = None if view.pooled else gen_sequence.piece_notes(generation_model(folder, name)[1], list(ids))
    figure = sequence_heatmap(view.values, view.labels, view.segments, view.marks, title=title, notes=notes)
    return figure, gen_sequence.sequence_statement(view)


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
    float64, problem = None, None
    with working("Checking the cache again in float64…"):
        try:
            float64 = cached_float64_check(folder, name, request["prompt"], request["new_tokens"],
                                           sampling_key(sampling_of(request)), request["keep"])
        except Exception as failure:  # noqa: BLE001 - an op without a float64 kernel: the check is left out, said so
            problem = problem_text(failure)
            logging.getLogger("attnviz").warning("The float64 check failed for %s", name, exc_info=failure)
    cache_section(cached, uncached, step, float64, problem)


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
    chosen = cached.steps[step]
    show_figure(bar_chart(sources, chosen.cross_attention[layer, head].tolist(),
                          title=f"Step {step + 1}: cross-attention of layer {layer}, head {head} over the source",
                          y_title="weight"),
                "The same query's weights over the encoder's tokens (the prompt): which source tokens this output "
                "token reads.", key="gen_cross")
    matrix = reading.cross_timeline(cached, layer, head)
    rows = token_labels(labels[len(cached.prompt_ids):], [s.position for s in cached.steps])
    show_figure(matrix_heatmap(matrix, rows, sources, title=f"Cross-attention timeline, layer {layer}, head {head}",
                               x_title="source token", y_title="generated token", show_values=False),
                "One row per generated token: its cross-attention over the whole source (a translation's alignment "
                "shows up as a diagonal).", key="gen_cross_timeline")


def cache_section(cached: gen.Generation, uncached: gen.Generation, step: int,
                  float64: tuple[bool, float] | None, float64_problem: str | None = None) -> None:
    st.subheader("The KV cache, as the model holds it")
    chosen = cached.steps[step]
    st.dataframe(reading.cache_table(chosen), hide_index=True)
    if cached.encoder_decoder:
        st.caption(f"The cross-attention cache: the encoder's K and V in every layer, {chosen.cross_keys[0]} per "
                   f"layer, {human_bytes(chosen.cross_bytes)} in all, computed at the first step and only read after "
                   "it.")
    same, difference = gen.cache_agreement(cached, uncached)
    with_cache = statistics.median(s.seconds for s in cached.steps[1:]) if len(cached.steps) > 1 else 0.0
    without = statistics.median(s.seconds for s in uncached.steps[1:]) if len(uncached.steps) > 1 else 0.0
    columns = st.columns(4)
    columns[0].metric("Cache after this step" + (" (self + cross)" if cached.encoder_decoder else ""),
                      human_bytes(chosen.cache_bytes + chosen.cross_bytes))
    columns[1].metric("Same tokens uncached", "yes" if same else "no",
                      help="Whether generating without the cache (every step runs the whole sequence) gives the "
                           "same tokens.")
    largest = gen.largest_logit(cached)
    columns[2].metric("Largest logit difference", f"{difference:.1e}",
                      help=f"Over every step and every token of the vocabulary, with and without the cache. The "
                           f"logits reach {largest:.3g}, so this is {difference / max(largest, 1e-30):.1e} of "
                           "them: the rounding of the model's arithmetic summing in two orders (one new row "
                           "against the whole sequence). Below the figures: the same check on a float64 copy.")
    columns[3].metric("Time per token", f"{with_cache * 1e3:.1f} / {without * 1e3:.1f} ms",
                      help="With the cache / without it: the median over the steps after the first.")
    if float64_problem is not None:  # the generation above ran; only its float64 copy could not
        again = f"Not checked again in float64: the float64 copy of the model could not run ({float64_problem})."
    elif float64 is None:
        again = (f"Not checked again in float64: the model has more than {gen.FLOAT64_CHECK_PARAMETERS / 1e6:.0f}M "
                 "parameters, or weights offloaded to disk.")
    elif float64[0]:
        again = (f"On a float64 copy of the model the two runs give the same tokens and logits that differ by at most "
                 f"**{float64[1]:.1e}**: what differs above is rounding, not the cache.")
    else:
        again = (f"On a float64 copy of the model the two runs choose different tokens (logits differ by up to "
                 f"{float64[1]:.1e} over the steps both took): a near-tie the rounding tipped, or a cache that "
                 "changes the result.")
    st.caption(
        f"After step {step + 1} the cache holds K and V for {reading.cache_holds(chosen)}. With it, "
        "each step feeds only the newest token; without it, every step runs the whole sequence again: the same "
        "tokens and logits (up to rounding), more work. Times are medians over the steps after the first, on this "
        f"machine. {again}"
    )


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
        full = [facts.layer for facts in samples[0].layers if not facts.sliding]
        st.info(f"{problem}." + (f" Layers that keep every token: {', '.join(map(str, full))}." if full else
                                 " Every layer of this model slides a window shorter than this sequence."),
                icon=":material/info:")
        return
    show_figure(block_table_figure(demo.cache, demo.names, title="Block tables: logical block → physical block"),
                "Orange: a physical block shared by several sequences (the prompt's full blocks); blue: a block "
                "one sequence owns. The number is the physical block.", key="gen_block_table")
    show_figure(memory_map_figure(demo.cache, title="The pool of physical blocks"),
                "Every block of K/V memory in use; hover to see which sequences read it.", key="gen_memory_map")
    report = demo.cache.memory(max_length)
    columns = st.columns(4)
    columns[0].metric("Paged cache", human_bytes(report["paged_bytes"]), help=f"{report['blocks_in_use']} blocks")
    columns[1].metric(f"Contiguous, {max_length} tokens each", human_bytes(report["contiguous_bytes"]))
    columns[2].metric("Internal fragmentation", f"{report['fragmentation']:.0%}",
                      help=f"{report['wasted_slots']} of {report['blocks_in_use'] * demo.cache.block_size} slots "
                           "hold no token")
    columns[3].metric("Through the block table", "identical" if demo.identical else "DIFFERENT")
    st.caption(
        f"{gen_systems.paged_statement(demo, layer)} A contiguous cache reserves the model's full context "
        f"({max_length} "
        "tokens) per sequence up front. Attention of a seeded query over each sample's K/V, read through its block "
        "table, gives the same bits as on contiguous tensors."
    )


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
    st.markdown(
        f"The {record.n_q} tokens of the generated text, split over **{devices} simulated devices**: each keeps "
        "its queries, attends them to the K/V block it holds, merges the result with the online-softmax rule, "
        f"and passes the block on. Largest difference from full causal attention: **{difference:.1e}** "
        f"(layer {layer}, the model's real Q, K, V)."
    )
    show_figure(ring_figure(trace.held, trace.status, title="Who holds which K/V block at each step"),
                f"Each step every device passes its block to the next. With the causal mask a device skips blocks "
                f"from later in the sequence: {trace.computed_share():.0%} of the device-steps compute.",
                key="gen_ring")
    heads, kv_heads, head_dim = record.n_heads, record.n_kv_heads, record.queries.shape[-1]
    rows = []
    for n in (record.n_q, 131_072, 1_048_576):
        for p in (1, 2, 4, 8):
            if p > n:
                continue
            memory = ring_memory(n, p, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
            rows.append({"tokens N": f"{n:,}", "devices P": p, "tokens per device": f"{memory['block_tokens']:,}",
                         "memory per device": human_bytes(memory["per_device"]),
                         "sent per step by each device": human_bytes(memory["sent_per_step"]) if p > 1 else "—"})
    st.dataframe(rows, hide_index=True)
    st.caption(f"This model's shape ({heads} heads, {kv_heads} K/V heads, head dim {head_dim}), bf16, one layer: "
               "a device holds its queries, two K/V blocks (the one it works on and the one arriving) and its "
               "running output; per-device memory falls as 1/P while each step sends one K/V block.")


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
