"""The patching experiment of the "Does this head matter?" page: one set of examples (clean and corrupted prompts,
answer and foil), one direction and one metric, looked at several ways: by layer and position, by head, by a head's
queries, keys, values or pattern, by path from head to head. Results are computed behind a button, with progress, and
kept by everything they depend on."""

from __future__ import annotations

import streamlit as st
import torch

from attnviz.core import circuits
from attnviz.core.tokens_display import readable_tokens, tokenizer_style
from attnviz.core.units import ordinal
from attnviz.interventions import activation_patching as ap
from attnviz.interventions import composition as comp
from attnviz.interventions import logit_attribution as dla
from attnviz.interventions import patching as patch
from attnviz.interventions import path_patching as pp
from attnviz.interventions.anatomy import NotReadable, anatomy
from attnviz.pagelogic import patching as words
from attnviz.ui.caches.importance import keep_form
from attnviz.ui.caches.store import BoundedStore
from attnviz.ui.figures import show_figure
from attnviz.ui.patching_run_results import cached_composition, composition_or_none
from attnviz.ui.patching_runs import FORM as CORPUS_FORM
from attnviz.ui.patching_runs import KEYS_TIP, choose_receiver, corpus_patching_view
from attnviz.viz import composition as composition_figures
from attnviz.viz import logit_attribution as dla_figures
from attnviz.viz import patching as figures
from attnviz.viz.style import format_number

LOOKS = ("Layer × position", "Heads", "Head inputs", "Paths", "Logit attribution", "Logit lens", "Composition")
PRESET = "Preset: induction"
CORPUS = "A corpus, in the background"
CHANGES = {"copied": "the token to copy", "previous": "the token before it"}
FORM = ("pat_source", "pat_change", "pat_period", "pat_seed", "pat_examples", "pat_clean", "pat_corrupted",
        "pat_answer", "pat_foil", "pat_bos", "pat_direction", "pat_metric", "pat_look", "pat_site", "pat_input",
        "pat_by_position", "pat_receiver", "pat_via", "pat_kind")


@st.cache_resource(show_spinner=False)
def _store() -> BoundedStore:
    return BoundedStore(24)


@st.cache_resource(max_entries=4, show_spinner=False)
def _parts(folder: str, name: str, _model, n: int):
    try:
        return anatomy(_model, {"input_ids": torch.zeros((1, n), dtype=torch.long)})
    except (NotReadable, RuntimeError) as problem:
        return str(problem)


def _progress(label: str):
    bar = st.progress(0.0, text=label)
    return bar, (lambda share, what: bar.progress(min(1.0, share), text=f"{label} {what}"))


def _examples(tokenizer) -> tuple[list[patch.Prompts], str] | str | None:
    """The experiment's examples from the form, and what they are in words (None: the form says what is wrong;
    :data:`CORPUS`: a corpus, measured in the background instead)."""
    source = st.segmented_control("Inputs", (PRESET, "My own prompts", CORPUS), default=PRESET, key="pat_source",
                                  required=True)
    if source == CORPUS:
        return CORPUS
    bos = tokenizer.bos_token_id
    if source == PRESET:
        columns = st.columns(4)
        change = columns[0].selectbox("Corrupt", list(CHANGES), format_func=CHANGES.get, key="pat_change",
                                      help="The token to copy: tells the path through an induction head's values. "
                                           "The token before it: tells the path through its keys (the token to copy "
                                           "stays, but nothing marks it as following the last typed token).")
        period = columns[1].slider("Tokens in the first copy", 8, 60, 30, key="pat_period")
        seed = columns[2].number_input("First seed", 0, 10_000, 5, key="pat_seed")
        count = columns[3].slider("Examples (one seed each)", 1, 16, 8, key="pat_examples")
        pool = circuits.ordinary_token_ids(tokenizer)
        examples = [patch.induction_prompts(pool, period, seed=seed + k, bos=bos, change=change) for k in range(count)]
        stop = period // 2
        changed = "that token" if change == "copied" else f"the {ordinal(stop)} token (the one before it)"
        start = "the BOS token, then " if bos is not None else ""
        return examples, (f"{count} examples. Clean: {start}{period} random tokens, then the first {stop} again; a "
                          "model that copies continues with the "
                          f"{ordinal(stop + 1)} token of the first copy (the answer). Corrupted: the same with "
                          f"{changed} of the first copy changed. Only that position differs.")
    columns = st.columns([4, 4, 2, 2])
    clean = columns[0].text_input("Clean prompt", "When the boy and the girl went to the store, the girl gave a drink "
                                  "to the", key="pat_clean")
    corrupted = columns[1].text_input("Corrupted prompt (the same number of tokens)", "When the boy and the girl went "
                                      "to the store, the boy gave a drink to the", key="pat_corrupted")
    answer = columns[2].text_input("Answer (its first token)", " boy", key="pat_answer")
    foil = columns[3].text_input("Foil (its first token)", " girl", key="pat_foil",
                                 help="empty: the corrupted run's most likely other token")
    with_bos = bos is not None and st.checkbox(f"Put the BOS token `{tokenizer.bos_token}` first", True, key="pat_bos")
    prompts = patch.own_prompts(tokenizer, clean, corrupted, answer, foil, with_bos)
    if isinstance(prompts, str):
        st.warning(prompts, icon=":material/edit:")
        return None
    return [prompts], "One example: no spread or interval (the preset gives several)."


def experiment_view(folder: str, name: str, model, tokenizer, objective: str) -> None:
    keep_form(FORM + CORPUS_FORM)
    if objective != "next-token":
        st.info("Patching here measures a decoder's next token: choose a decoder (the bundled tiny GPT has a preset). "
                "From Python, `attnviz.patch` also reads a masked LM at its mask's position.", icon=":material/info:")
        return
    found = _examples(tokenizer)
    if found is None:
        return
    if found == CORPUS:
        corpus_patching_view(folder, name, model, tokenizer)
        return
    examples, described = found
    st.caption(described)
    st.code(patch.prompt_lines(tokenizer, examples[0]), language=None)
    parts = _parts(folder, name, model, len(examples[0].clean))
    if isinstance(parts, str):
        st.warning(f"This model's layers could not be read for patching: {parts}.", icon=":material/block:")
        return
    look = st.segmented_control("Look at", LOOKS, default=LOOKS[0], key="pat_look", required=True)
    columns = st.columns([3, 3, 4])
    direction = columns[0].selectbox("Direction", list(ap.DIRECTIONS), key="pat_direction",
                                     help="; ".join(f"{k}: {v}" for k, v in ap.DIRECTIONS.items()),
                                     disabled=look in ("Logit attribution", "Logit lens", "Composition"))
    metric = columns[1].selectbox("Metric", list(ap.METRICS), key="pat_metric",
                                  help="; ".join(f"{k}: {v}" for k, v in ap.METRICS.items()),
                                  disabled=look in ("Logit attribution", "Logit lens", "Composition"))
    base = (folder, name, tuple((tuple(e.clean), tuple(e.corrupted), e.answer, e.foil) for e in examples),
            direction, metric)
    if look == "Composition":
        _composition_view(folder, name, model)
    elif look in ("Logit attribution", "Logit lens"):
        _direct_view(base[:3], look, model, tokenizer, examples, parts)
    elif look == "Paths":
        _paths_view(base, model, tokenizer, examples, parts, direction, metric, folder, name)
    else:
        _map_view(base, look, model, tokenizer, examples, parts, direction, metric)


def _ends(result, metric: str, examples: list, tokenizer) -> None:
    style = tokenizer_style(tokenizer)
    answer, foil = (readable_tokens(tokenizer.convert_ids_to_tokens([token]), style)[0]
                    for token in (examples[0].answer, result.foils[0]))
    columns = st.columns(4)
    columns[0].metric(f"{metric.capitalize()}, clean", format_number(float(result.clean.mean())),
                      help=f"mean over {len(examples)} example(s); " + ap.METRICS[metric])
    columns[1].metric(f"{metric.capitalize()}, corrupted", format_number(float(result.corrupted.mean())))
    columns[2].metric("Gap", format_number(float((result.clean - result.corrupted).mean())),
                      help="each example's share divides by its own gap")
    columns[3].metric("Answer / foil" + (" (first example)" if len(examples) > 1 else ""), f"{answer!r} / {foil!r}",
                      help="The foil: " + ("as given" if examples[0].foil is not None else
                                           "the corrupted run's most likely token other than the answer"))
    if metric == "logit difference":
        for level, said in patch.problems(float(result.clean.mean()), float(result.corrupted.mean()), answer, foil):
            (st.error if level == "error" else st.warning)(said, icon=":material/warning:")


def _compute(key: tuple, label: str, work):
    store = _store()
    found = store.get(key)
    if found is None:
        bar, progress = _progress(label)
        found = work(progress)
        bar.empty()
        store.put(key, found)
    return found


def _map_view(base, look, model, tokenizer, examples, parts, direction, metric) -> None:
    if look == "Layer × position":
        site = st.segmented_control("Patch", ("resid", "attn", "mlp"), default="resid", key="pat_site",
                                    format_func=ap.SITES.get, required=True)
        by_position = True
    elif look == "Heads":
        site = "head"
        by_position = st.toggle("One cell per head and position", False, key="pat_by_position")
    else:
        site = st.segmented_control("Patch only the head's", ("q", "k", "v", "pattern"), default="k", key="pat_input",
                                    format_func=lambda s: {"q": "queries", "k": "keys", "v": "values",
                                                           "pattern": "pattern"}[s], required=True)
        by_position = st.toggle("One cell per head and position", False, key="pat_by_position")
    key = (*base, site, by_position)
    if key not in _store():
        if not st.button(f"Patch: {ap.SITES[site]}", type="primary", key="pat_run", icon=":material/play_arrow:"):
            st.info("Press the button: each cell is patched on every example, batched.", icon=":material/info:")
            return
    whole = site == "head" and not by_position  # every head of a layer at once, as the last column

    def work(progress):
        found = ap.patch_map(model, examples, site, direction=direction, metric=metric, by_position=by_position,
                             parts=parts, progress=progress)
        return found, ap.whole_layers(model, examples, site, direction=direction, metric=metric,
                                      parts=parts) if whole else None

    try:
        result, layers = _compute(key, "Patching:", work)
    except ValueError as problem:
        st.warning(f"Not patched: {problem}.", icon=":material/block:")
        return
    _ends(result, metric, examples, tokenizer)
    style = tokenizer_style(tokenizer)
    positions = words.position_labels(readable_tokens(tokenizer.convert_ids_to_tokens(examples[0].clean), style),
                                      readable_tokens(tokenizer.convert_ids_to_tokens(examples[0].corrupted), style))
    shares, rows = words.as_grid(result)
    columns = positions if shares.shape[-1] == len(positions) and (by_position or site in ("resid", "attn", "mlp")) \
        else words.head_labels(result.heads)
    if layers is not None:  # [examples, layers] beside the heads, a gap between
        gap = torch.full((*layers.shape, 1), float("nan"), dtype=shares.dtype)
        shares = torch.cat([shares, gap, layers[..., None].to(shares.dtype)], dim=-1)
        columns = [*columns, "", "all heads"]
    spread = ap.spread(shares)
    measure = "restored share" if direction == "denoising" else "share taken away"
    show_figure(figures.spread_heatmap(
        spread.mean, spread.low, spread.high, spread.std, rows, columns, examples=spread.examples, measure=measure,
        title=f"{ap.SITES[site].capitalize()} patched ({direction}): mean share of the {metric} gap"
              + (" (last column: every head of the layer at once)" if layers is not None else ""),
        x_title="position (clean token; ▶ where the prompts differ)" if columns is positions else "head"),
        "1: the patch alone " + ("brings the clean answer back" if direction == "denoising" else
                                 "breaks the answer as the corruption does") + "; 0: nothing. Hover: each cell's 95% "
        "interval over the examples.", key="pat_map")
    st.markdown(words.map_words(shares, rows, columns, direction))
    values, labels = words.top_cells(shares, rows, columns)
    top = ap.spread(values)
    show_figure(figures.example_dots(values, labels, top.low, top.high, measure=measure,
                                     title="The largest cells, example by example"),
                "Dots: single examples; bars: their mean with its 95% bootstrap interval.", key="pat_dots")


def _paths_view(base, model, tokenizer, examples, parts, direction, metric, folder, name) -> None:
    columns = st.columns([3, 3, 4])
    chosen = choose_receiver(folder, name, model, tokenizer, columns, "pat")
    if chosen is None:
        return
    receiver, via = chosen
    if st.session_state.get("pat_source", PRESET) == PRESET and st.session_state.get("pat_change") == "copied" \
            and via == "k":
        st.caption(KEYS_TIP)
    key = (*base, "paths", receiver, via)
    if key not in _store():
        if not columns[2].button("Trace the paths", type="primary", key="pat_paths_run", icon=":material/route:"):
            st.info("Press the button: every head before the receiver is a sender, with the MLPs between them held "
                    "(the direct path), free, and free one at a time.", icon=":material/info:")
            return

    def work(progress):
        variants = ["frozen", "free", *[(at,) for at in range(receiver[0])]]
        results = []
        for index, mlps in enumerate(variants):
            results.append(pp.path_patching(
                model, examples, receiver, via, mlps=mlps, direction=direction, metric=metric, parts=parts,
                progress=lambda share, what, index=index: progress((index + share) / len(variants), what)))
        return results

    try:
        frozen, free, *through = _compute(key, "Path patching:", work)
    except ValueError as problem:
        st.warning(f"Not traced: {problem}.", icon=":material/block:")
        return
    _ends(free, metric, examples, tokenizer)
    measure = "restored share" if direction == "denoising" else "share taken away"
    heads = [f"H{head}" for head in range(free.shares.shape[-1])]
    two = st.columns(2)
    for column, result, said in ((two[0], frozen, "MLPs held: the direct path"),
                                 (two[1], free, "MLPs free: direct and through the MLPs")):
        spread = result.share_spread
        with column:
            show_figure(figures.spread_heatmap(
                spread.mean, spread.low, spread.high, spread.std, result.rows, heads, examples=spread.examples,
                measure=measure, title=f"Into L{receiver[0]} H{receiver[1]}'s {pp.VIA[via]}: {said}",
                x_title="sender head", width=520),
                "Each cell: the sender's change reaching the receiver only through this input.",
                key=f"pat_path_{result.mlps}")
    if free.note:
        st.caption(free.note)
    st.markdown(words.path_words(frozen, free, {at: result for at, result in enumerate(through)},
                                 composition_or_none(folder, name, via.upper(), model)))




def _composition_view(folder: str, name: str, model) -> None:
    """Q-, K- and V-composition from the weights alone: no prompt, no run."""
    kind = st.segmented_control("Composition", ("Q", "K", "V"), default="K", key="pat_kind", required=True,
                                help="How much of what an earlier head writes (its OV circuit) a later head reads "
                                     "through its queries, its keys or its values (Elhage et al. 2021)")
    result = cached_composition(folder, name, kind, model)
    if isinstance(result, str):
        st.warning(f"Composition is not read for this model: {result}.", icon=":material/block:")
        return
    show_figure(composition_figures.composition_heatmap(
        result.scores, result.labels, kind=kind, baseline_mean=result.baseline_mean,
        baseline_spread=result.baseline_spread), "Senders down, receivers across; red: above what random matrices "
        "of the same shapes score (hover: how many of their spreads above).", key="pat_composition")
    for said in comp.composition_words(result):
        st.markdown(said)
    st.caption("From the weights alone: a pair that scores high can compose; whether the model uses it on a given "
               "input is what the Paths look measures.")


def _direct(key: tuple, model, examples, parts):
    """Each example's clean prompt read directly: its attribution at every position and its logit lens (or why
    not, in words), with the foil each example is measured against."""
    def work(progress):
        found = []
        for index, example in enumerate(examples):
            foil = ap.ends(model, example, "logit difference").foil
            try:
                found.append((foil, dla.direct_logit_attribution(model, example.clean, example.answer, foil,
                                                                 anatomy=parts),
                              dla.logit_lens(model, example.clean, example.answer, foil, anatomy=parts)))
            except ValueError as problem:
                return str(problem)
            progress((index + 1) / len(examples), f"example {index + 1} of {len(examples)}")
        return found

    return _compute((*key, "direct"), "Reading each example's clean run:", work)


def _token(tokenizer, token: int) -> str:
    return readable_tokens(tokenizer.convert_ids_to_tokens([token]), tokenizer_style(tokenizer))[0]


def _direct_view(key: tuple, look: str, model, tokenizer, examples, parts) -> None:
    """Direct logit attribution and the logit lens of the experiment's clean prompts (no patching: one forward each),
    the answer against each example's foil."""
    found = _direct(key, model, [ap.examples_of(example)[0] for example in examples], parts)
    if isinstance(found, str):
        st.warning(f"Not read directly: {found}.", icon=":material/block:")
        return
    foil, attribution, lens = found[0]
    answer_text, foil_text = _token(tokenizer, examples[0].answer), _token(tokenizer, foil)
    if look == "Logit lens":
        style = tokenizer_style(tokenizer)
        tokens = readable_tokens(tokenizer.convert_ids_to_tokens(examples[0].clean), style)
        show_figure(dla_figures.lens_heatmap(
            lens.difference, lens.rows, tokens, probability=lens.probability, rank=lens.rank,
            top_tokens=[[_token(tokenizer, int(t)) for t in row] for row in lens.top.tolist()],
            answer_top=lens.top == lens.answer,
            title=f"Logit lens, first example: logit({answer_text!r}) - logit({foil_text!r}) read at each layer"),
            f"Each row: the stream at that point read through {lens.note}. Hover: the answer's probability and rank, "
            "and the top token.", key="pat_lens")
        for said in dla.lens_words(lens, answer_text=answer_text, foil_text=foil_text,
                                   token_text=lambda t: _token(tokenizer, t)):
            st.markdown(said)
        return
    per_example = torch.stack([attribution.head_map(-1) for _, attribution, _ in found])  # [examples, layers, heads]
    spread = ap.spread(per_example)
    rows = [layer.attention.label for layer in parts.layers]
    show_figure(figures.spread_heatmap(
        spread.mean, spread.low, spread.high, spread.std, rows, words.head_labels(parts.heads),
        examples=spread.examples, measure="logit difference", value_range=None, x_title="head",
        title="Each head's direct part of logit(answer) - logit(foil) at the last position (mean over examples)"),
        f"Red: the head writes toward the answer through the unembedding, {attribution.note}; blue: toward the foil. "
        "Hover: each head's 95% interval over the examples.", key="pat_dla_heads")
    st.markdown(words.map_words(per_example, rows, words.head_labels(parts.heads), "attribution"))
    show_figure(dla_figures.attribution_bars(
        attribution.values[:, -1], attribution.labels, attribution.layers, total=float(attribution.values[:, -1].sum()),
        title=f"First example: every part of logit({answer_text!r}) - logit({foil_text!r}) at the last position"),
        "The parts add up to the model's own logit difference (the last bar).", key="pat_dla_bars")
    for said in dla.attribution_words(attribution, answer_text=answer_text, foil_text=foil_text):
        st.markdown(said)
