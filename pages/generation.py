"""Generation and KV cache: a real decoder (or encoder-decoder) writes token by token; each step's attention, the
cache it keeps, and the systems that serve it (PagedAttention, Ring attention), simulated exactly on a decoder's
own tensors."""

import html
import statistics

import streamlit as st

from attnviz.flash.ring import ring_memory
from attnviz.models.capture import capture
from attnviz.models.loading import BUNDLED_GPT_NAME, architecture_of_folder
from attnviz.pagelogic import generation as gen
from attnviz.pagelogic import generation_heads as gen_heads
from attnviz.pagelogic import generation_systems as gen_systems
from attnviz.ui.figures import show_figure
from attnviz.ui.frame import start_page, transient_note
from attnviz.ui.loaded_models import generation_model, load_bundle
from attnviz.ui.messages import problem_text, queries_unavailable
from attnviz.ui.session_models import current_model_name, registered_models
from attnviz.units import human_bytes
from attnviz.viz.charts import bar_chart, line_chart
from attnviz.viz.inference import block_table_figure, memory_map_figure, ring_figure
from attnviz.viz.matrix import matrix_heatmap
from attnviz.viz.style import token_labels

DEFAULT_PROMPT = ("The for statement is used to iterate over the elements of a sequence (such as a string, tuple "
                  "or list) or other iterable object.")
TABS = ["Generation", "PagedAttention", "Ring attention"]
MAX_NEW_TOKENS = 64


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


def request_form() -> dict:
    """The generation's settings, applied with the Generate button (so typing never reruns the model)."""
    defaults = {"prompt": DEFAULT_PROMPT, "new_tokens": 12, "strategy": "greedy", "temperature": 1.0, "top_k": 0,
                "top_p": 1.0, "seed": 0}
    request = st.session_state.setdefault("gen_request", dict(defaults))
    with st.form("gen_form", border=False):
        top = st.columns([6, 2])
        # The widgets start from the settings in use (after a visit to another page they are drawn afresh).
        prompt = top[0].text_input("Prompt", request["prompt"], key="gen_prompt", max_chars=2000)
        new_tokens = top[1].number_input("New tokens", 1, MAX_NEW_TOKENS, request["new_tokens"], key="gen_count")
        columns = st.columns([3, 2, 2, 2, 1])
        strategy = columns[0].radio("Decoding", list(gen.STRATEGIES), format_func=gen.STRATEGIES.get,
                                    index=list(gen.STRATEGIES).index(request["strategy"]), key="gen_strategy",
                                    horizontal=True)
        temperature = columns[1].slider("Temperature", 0.1, 2.0, request["temperature"], 0.1, key="gen_temperature",
                                        help="Sampling only: logits are divided by it before the softmax.")
        top_k = columns[2].number_input("Top-k (0: off)", 0, 1000, request["top_k"], key="gen_top_k")
        top_p = columns[3].slider("Top-p", 0.05, 1.0, request["top_p"], 0.05, key="gen_top_p",
                                  help="Sampling only: keep the most likely tokens until their mass reaches p.")
        seed = columns[4].number_input("Seed", 0, 10_000, request["seed"], key="gen_seed")
        if st.form_submit_button("Generate", type="primary"):
            request.update(prompt=prompt, new_tokens=int(new_tokens), strategy=strategy,
                           temperature=float(temperature), top_k=int(top_k), top_p=float(top_p), seed=int(seed))
    st.button("One more token", key="gen_more", on_click=lambda: request.update(
        new_tokens=min(MAX_NEW_TOKENS, request["new_tokens"] + 1)), help="The same generation, one step longer.")
    return request


def sampling_of(request: dict, seed_offset: int = 0) -> gen.Sampling:
    return gen.Sampling(request["strategy"], request["temperature"], request["top_k"], request["top_p"],
                        request["seed"] + seed_offset)


@st.cache_resource(max_entries=16, show_spinner=False)
def cached_generation(folder: str, name: str, prompt: str, new_tokens: int, sampling: tuple, use_cache: bool):
    model, tokenizer = generation_model(folder, name)
    return gen.generate(model, tokenizer, prompt, new_tokens, gen.Sampling(*sampling), use_cache=use_cache)


@st.cache_resource(max_entries=16, show_spinner=False)
def cached_float64_check(folder: str, name: str, prompt: str, new_tokens: int, sampling: tuple):
    model, tokenizer = generation_model(folder, name)
    return gen.float64_cache_agreement(model, tokenizer, prompt, new_tokens, gen.Sampling(*sampling))


def sampling_key(sampling: gen.Sampling) -> tuple:
    return (sampling.strategy, sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed)


def run(folder: str, name: str, request: dict, seed_offset: int = 0, use_cache: bool = True) -> gen.Generation:
    return cached_generation(folder, name, request["prompt"], request["new_tokens"],
                             sampling_key(sampling_of(request, seed_offset)), use_cache)


def show_text(generation: gen.Generation, step: int, tokenizer) -> None:
    """The prompt, then the generated tokens (bold), the chosen step's token marked; for an encoder-decoder, the
    source the encoder read, then what the decoder wrote after its start token."""
    parts = [html.escape("".join(generation.prompt_tokens))]
    if generation.encoder_decoder:
        source = tokenizer.decode(generation.source_ids, skip_special_tokens=True)
        parts = [f'<span style="color:#555">{html.escape(source)}</span> → ']
    pieces = generation.pieces(tokenizer) if generation.encoder_decoder else [s.token for s in generation.steps]
    for index, piece in enumerate(pieces):
        text = html.escape(piece)
        style = "background:#ffe0b2;" if index == step else ""
        parts.append(f'<b style="color:#c2410c;{style}">{text}</b>')
    st.html(f'<div style="font-size:1.15rem; line-height:1.7; white-space:pre-wrap">{"".join(parts)}</div>')


def generation_tab(folder: str, name: str, request: dict, model, tokenizer) -> None:
    with transient_note("Generating with the KV cache, then again without it…"):
        cached = run(folder, name, request)
        uncached = run(folder, name, request, use_cache=False)
    n_steps = len(cached.steps)
    layers, heads = cached.steps[0].attention.shape[:2]
    columns = st.columns([4, 1, 1])
    step = columns[0].slider("Step", 1, n_steps, n_steps, key="gen_step") - 1 if n_steps > 1 else 0
    if cached.encoder_decoder:
        start_layer, start_head = 0, 0
    else:  # opens on the strongest induction head: it looks back at what followed the current token before
        induction = next(h for h in cached_circuits(folder, name) if h.name == "induction head")
        start_layer, start_head = induction.layer, induction.head
    layer = int(columns[1].number_input("Layer", 0, layers - 1, start_layer, key="gen_layer"))
    head = int(columns[2].number_input("Head", 0, heads - 1, start_head, key="gen_head"))
    show_text(cached, step, tokenizer)
    chosen = cached.steps[step]
    left, right = st.columns(2)
    with left:
        labels = [repr(token)[1:-1] or "·" for token, _ in chosen.top]
        show_figure(bar_chart(labels, [p for _, p in chosen.top], title=f"Step {step + 1}: next-token distribution",
                              y_title="probability", text=[f"{p:.2f}" for _, p in chosen.top]),
                    (f"The model's {len(chosen.top)} most likely next tokens; greedy takes the first: "
                     if request["strategy"] == "greedy" else
                     f"The {len(chosen.top)} most likely tokens of the distribution the token was drawn from "
                     "(after temperature, top-k and top-p); chosen: ") + f"{chosen.token!r}.", key="gen_top")
    with right:
        keys = token_labels([repr(t)[1:-1] for t in cached.tokens[: chosen.position]])
        weights = chosen.attention[layer, head].numpy()
        what = "decoder self-attention" if cached.encoder_decoder else "attention"
        window = gen.window_statement(cached, step, layer)
        show_figure(bar_chart(keys, weights.tolist(), title=f"Step {step + 1}: {what} of layer {layer}, head "
                                                            f"{head}", y_title="weight"),
                    "The weights of the query that predicted this token (the last token read) over every earlier "
                    "token" + (" of the decoder (its start token, then what it wrote)" if cached.encoder_decoder
                               else "") + f"; {gen.row_sum_statement(cached, step, layer, head)}."
                    + (f" {window}" if window else ""),
                    key="gen_attention")
    if cached.encoder_decoder:
        cross_section(cached, step, layer, head)
    sliding = layer < len(cached.layers) and cached.layers[layer].sliding
    matrix = gen.timeline(cached, layer, head)[: step + 1]  # [steps so far, positions]: it grows with the Step
    written = cached.steps[: step + 1]
    rows = token_labels([repr(s.token)[1:-1] for s in written], [s.position for s in written])
    show_figure(matrix_heatmap(matrix, rows, token_labels([repr(t)[1:-1] for t in cached.tokens]),
                               title=f"Timeline: each step's attention, layer {layer}, head {head}",
                               x_title="key position", y_title="generated token", show_values=False),
                f"One row per generated token up to step {step + 1} (labelled by its position): its query's weights "
                "over the earlier tokens, each at its position. Grey: keys the query did not read, positions that "
                "did not exist yet" + (f" and keys out of layer {layer}'s sliding window of "
                                       f"{cached.layers[layer].window:,} tokens" if sliding else "")
                + ". Move the Step slider to watch it build up.", key="gen_timeline")
    sink = gen.sink_mass(cached)[:, layer]  # [steps, heads]
    leaves = gen.first_token_leaves(cached, layer)
    show_figure(line_chart(list(range(1, n_steps + 1)), {f"head {h}": sink[:, h].tolist() for h in range(heads)},
                           title=f"Attention-sink mass: share on the first token, layer {layer}", x_title="step",
                           y_title="weight on token 0", markers=True),
                "Many decoders park attention on the first token when nothing else is relevant (Xiao et al., "
                "2023): a head that keeps a large share there is a sink."
                + (" Here the first token is the decoder's start token; at step 1 it is the only key, so every head "
                   "puts 1 on it." if cached.encoder_decoder else "")
                + (f" From step {leaves} on, token 0 is out of layer {layer}'s sliding window of "
                   f"{cached.layers[layer].window:,} tokens: no query reads it, so its share is 0."
                   if leaves else ""), key="gen_sink")
    with transient_note("Checking the cache again in float64…"):
        float64 = cached_float64_check(folder, name, request["prompt"], request["new_tokens"],
                                       sampling_key(sampling_of(request)))
    cache_section(cached, uncached, step, float64)


def cross_section(cached: gen.Generation, step: int, layer: int, head: int) -> None:
    """An encoder-decoder's cross-attention: where each new token's query looks in the source."""
    sources = token_labels([repr(t)[1:-1] for t in cached.source_tokens])
    chosen = cached.steps[step]
    show_figure(bar_chart(sources, chosen.cross_attention[layer, head].tolist(),
                          title=f"Step {step + 1}: cross-attention of layer {layer}, head {head} over the source",
                          y_title="weight"),
                "The same query's weights over the encoder's tokens (the prompt): which source tokens this output "
                "token reads.", key="gen_cross")
    matrix = gen.cross_timeline(cached, layer, head)
    rows = token_labels([repr(s.token)[1:-1] for s in cached.steps], [s.position for s in cached.steps])
    show_figure(matrix_heatmap(matrix, rows, sources, title=f"Cross-attention timeline, layer {layer}, head {head}",
                               x_title="source token", y_title="generated token", show_values=False),
                "One row per generated token: its cross-attention over the whole source (a translation's alignment "
                "shows up as a diagonal).", key="gen_cross_timeline")


def cache_section(cached: gen.Generation, uncached: gen.Generation, step: int,
                  float64: tuple[bool, float] | None) -> None:
    st.subheader("The KV cache, as the model holds it")
    chosen = cached.steps[step]
    st.dataframe(gen.cache_table(chosen), hide_index=True)
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
    columns[1].metric("Same tokens without the cache", "yes" if same else "no")
    largest = gen.largest_logit(cached)
    columns[2].metric("Largest logit difference", f"{difference:.1e}",
                      help=f"Over every step and every token of the vocabulary, with and without the cache. The "
                           f"logits reach {largest:.3g}, so this is {difference / max(largest, 1e-30):.1e} of "
                           "them: the rounding of the model's arithmetic summing in two orders (one new row "
                           "against the whole sequence). Below the figures: the same check on a float64 copy.")
    columns[3].metric("Time per token, cache / none", f"{with_cache * 1e3:.1f} / {without * 1e3:.1f} ms")
    if float64 is None:
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
        f"After step {step + 1} the cache holds K and V for {gen.cache_holds(chosen)}. With it, "
        "each step feeds only the newest token; without it, every step runs the whole sequence again: the same "
        "tokens and logits (up to rounding), more work. Times are medians over the steps after the first, on this "
        f"machine. {again}"
    )


@st.cache_resource(max_entries=4, show_spinner="Measuring the heads…")
def cached_circuits(folder: str, name: str):
    model, tokenizer = generation_model(folder, name)
    if name == BUNDLED_GPT_NAME:  # the pool it was trained to repeat
        pool = gen_heads.bundled_training_report()["repeat_token_ids"]
        return gen_heads.find_circuits(model, tokenizer, gen_heads.held_out_text(), pool=pool,
                                 pool_words=f"the {len(pool)} most frequent tokens of its training text")
    return gen_heads.find_circuits(model, tokenizer, gen_heads.held_out_text())


def circuits_section(folder: str, name: str) -> None:
    if architecture_of_folder(registered_models()[name]) != "decoder":
        return  # the circuits are measured on a causal LM's own text and repeated tokens
    with st.expander("Heads this model learned", expanded=name == BUNDLED_GPT_NAME):
        found = cached_circuits(folder, name)
        for head in found:
            st.markdown(head.in_words())
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
    with transient_note("Sampling the prompt three times…"):
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
    text = request["prompt"] + generation.text(tokenizer)
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
    start_page("Generation and KV cache")
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
        tabs = dict(zip(TABS, st.tabs(TABS, key="gen_tab", on_change="rerun", bind="query-params"), strict=True))
        bodies = {"Generation": lambda: generation_tab(folder, name, request, model, tokenizer),
                  "PagedAttention": lambda: paged_tab(folder, name, request),
                  "Ring attention": lambda: ring_tab(folder, name, request)}
        for title, body in bodies.items():
            if tabs[title].open:
                with tabs[title]:
                    body()
        circuits_section(folder, name)
    except ValueError as problem:
        st.warning(str(problem), icon=":material/warning:")
    except Exception as problem:  # noqa: BLE001 - whatever a checkpoint's code raises, said in words
        st.error(f"{name} could not generate from this prompt: {problem_text(problem)}.", icon=":material/error:")


main()
