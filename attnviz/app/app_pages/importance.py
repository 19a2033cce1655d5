"""Does this head matter? Remove heads one at a time (zero, or mean), differentiate a gate on each, and patch heads
from a clean input into a corrupted one: cause beside pattern, on any checkpoint whose attention attnviz records."""

import time

import streamlit as st
import torch

from attnviz.core import circuits
from attnviz.interventions import importance as imp
from attnviz.interventions import importance_ranks as ranking
from attnviz.interventions import induction_circuit as ind
from attnviz.interventions.edits import editable
from attnviz.models.loading import architecture_of_folder
from attnviz.models.shipped import BUNDLED_GPT_NAME
from attnviz.models.with_heads import declares_masked_lm_head
from attnviz.pagelogic import importance as importance_page
from attnviz.pagelogic import importance_words as words
from attnviz.pagelogic.importance import MEASURES, METHOD_TITLES
from attnviz.ui.caches.importance import (
    WITH_LOSS,
    cached_circuit,
    cached_mlp_ablation,
    cached_token_effect,
    corpus_texts,
    editable_model,
    heads_measured,
    keep_form,
    study,
)
from attnviz.ui.captures import cached_capture
from attnviz.ui.figures import show_figure
from attnviz.ui.frame import page_intro, start_page
from attnviz.ui.importance_maps import agreement_tables, show_maps
from attnviz.ui.importance_runs import corpus_run_view
from attnviz.ui.loaded_models import load_bundle
from attnviz.ui.messages import problem_text
from attnviz.ui.open_in_explore import switch_if_asked
from attnviz.ui.patching_views import experiment_view
from attnviz.ui.session_models import current_model_name, model_dtype, registered_models
from attnviz.ui.sidebar import current_sentence
from attnviz.viz import importance as figures
from attnviz.viz.style import format_number

VIEWS = ("Induction circuit", "Importance map", "Activation patching")
TEXT_SOURCES = ("Typed", "The bundled corpus", "A corpus, in the background")
MAX_BOX_CHARS = 100_000  # what the box holds: 64 texts of 256 tokens need far less


def choose_model(column) -> tuple[str, str]:
    """The model this page edits: the sidebar's when it has a loss (a decoder, an encoder-decoder, or an encoder
    saved with its masked-LM head), else the bundled tiny GPT (whose circuit the first view shows); any loaded model
    can be chosen."""
    models = registered_models()
    sidebar = current_model_name()
    names = list(models)
    has_loss = architecture_of_folder(models[sidebar]) in WITH_LOSS or declares_masked_lm_head(models[sidebar])
    default = sidebar if has_loss else (BUNDLED_GPT_NAME if BUNDLED_GPT_NAME in models else sidebar)
    name = column.selectbox("Model", names, index=names.index(default), key="imp_model",
                        format_func=lambda n: f"{n} ({architecture_of_folder(models[n]) or 'model'})",
                        help="A decoder or an encoder-decoder is measured by its own loss (its language-model head "
                             "is loaded), an encoder saved with its masked-LM head by its masked-LM loss; an encoder "
                             "without one by the change of its final hidden states.")
    return name, models[name]


def progress_bar(label: str):
    bar = st.progress(0.0, text=label)
    return bar, (lambda share, what: bar.progress(min(1.0, share), text=f"{label} {what}"))


def importance_view(folder: str, name: str, model, tokenizer, objective: str) -> None:
    source = st.segmented_control("Texts", TEXT_SOURCES, default=TEXT_SOURCES[0], key="imp_source", required=True,
                                  help="A corpus in the background: thousands of documents, measured in a process "
                                       "of its own into a DuckDB file; leave the page, it goes on.")
    if source == TEXT_SOURCES[2]:
        corpus_run_view(folder, name, tokenizer, objective)
        return
    texts = chosen_texts(source)
    key = (folder, name, tuple(texts))
    measured = measured_study(key, model, tokenizer, texts)
    if measured is None:
        return
    result, seconds = measured
    study_summary(result, seconds, tokenizer, objective)
    show_maps(result.maps, [module.label for module in result.modules], objective, "imp_map")
    mlp_view(key, model, result, objective)
    if len(result.maps) > 1:
        agreement_tables(result.maps)
    heads_beside_labels(folder, name, result)
    token_effect_view(key, model, result)


def mlp_view(key: tuple, model, result: imp.Study, objective: str) -> None:
    """Each layer's MLP removed the same ways as the heads, beside them: is the work in the heads at all?"""
    found = {how: cached_mlp_ablation(key, how, model, result) for how in ("zero", "mean") if how in result.maps}
    problem = next((said for said in found.values() if isinstance(said, str)), None)
    if problem or not found:
        st.caption(f"MLPs are not ablated for this model: {problem or 'no ablation map'}.")
        return
    values = torch.stack([one.values for one in found.values()], dim=1)  # [layers, methods]
    figure = figures.importance_heatmap(values, next(iter(found.values())).labels, measure=MEASURES[objective],
                                        title="Each layer's MLP removed", signed=objective != "hidden")
    figure.update_xaxes(title="ablation", ticktext=[METHOD_TITLES[how] for how in found])
    show_figure(figure, "The same measure as the head maps, for the layer's whole MLP (its output zeroed, or "
                        "replaced by its mean over the texts' tokens).", key="imp_mlp")
    st.markdown(words.mlp_words(found, result.maps))


def chosen_texts(source: str) -> list[str]:
    """The texts typed in the box, or the bundled corpus's first documents."""
    if source == TEXT_SOURCES[0]:
        box = st.text_area(
            "Texts, one per line", current_sentence(), key="imp_texts", height=110, max_chars=MAX_BOX_CHARS,
            help=f"At most {imp.MAX_TEXTS} texts, each read up to {imp.MAX_TOKENS} tokens. A map runs the model "
                 "once per head over all of them (batched), twice (zero and mean ablation), plus one backward pass.")
        return importance_page.texts_of(box)
    count = st.slider("Documents", 4, imp.MAX_TEXTS, 16, 4, key="imp_documents",
                      help="The first documents of the bundled corpus (Python's documentation and docstrings, "
                           "the Heads across a corpus page's default), each read up to "
                           f"{imp.MAX_TOKENS} tokens.")
    texts = corpus_texts(count)
    st.caption(f"{len(texts)} documents, from “{texts[0][:60]}…” to “{texts[-1][:60]}…”")
    return texts


def measured_study(key: tuple, model, tokenizer, texts: list[str]) -> tuple[imp.Study, float] | None:
    """Measure every head (the button, Stop and the progress), and (the study of these texts, the seconds it took)
    once measured; None until then (said)."""
    kept, note = heads_measured(key), st.empty()
    pressed = st.button("Measure every head", type="primary", key="imp_run", icon=":material/play_arrow:")
    if kept and not pressed and st.session_state.get("imp_done", {}).get("key") != key:
        note.info(f"Stopped after {kept:,} head ablations: **Measure every head** goes on from there.",
                  icon=":material/pause:")
    if pressed:
        if not texts:
            st.warning("Type a text first (one per line for several).", icon=":material/edit:")
            return None
        stop = st.empty()  # shown while the heads are measured, gone once they are
        stop.button("Stop", key="imp_stop", icon=":material/stop:",
                    help="Stops after the head being measured; what is measured is kept, and Measure every head "
                         "goes on from there.")
        bar, progress = progress_bar("Ablating heads:")
        started = time.perf_counter()
        try:
            study(key, model, tokenizer, texts, progress)
        except ValueError as problem:
            bar.empty()
            stop.empty()
            st.error(problem_text(problem), icon=":material/block:")
            return None
        bar.empty()
        stop.empty()
        st.session_state["imp_done"] = {"key": key, "seconds": time.perf_counter() - started}
    done = st.session_state.get("imp_done")
    if not done or done["key"] != key:
        if not kept:
            st.info("Press **Measure every head**: each head is removed in turn and the model run again on the "
                    "texts.", icon=":material/info:")
        return None
    result = study(key, model, tokenizer, texts, compute=False)
    if result is None:  # pushed out of the store by other sessions' maps since: measure again
        st.session_state.pop("imp_done", None)
        st.rerun()
    return result, done["seconds"]


def study_summary(result: imp.Study, seconds: float, tokenizer, objective: str) -> None:
    """What was measured (texts, heads, the loss without edits, the time), and how the texts were read."""
    predicting, tokens, cut = importance_page.study_counts(result, objective)
    columns = st.columns(4)
    columns[0].metric("Texts", f"{predicting:,}" if predicting == len(result.batch.texts) else
                      f"{predicting:,} of {len(result.batch.texts):,}",
                      help=f"{tokens:,} tokens read in all" + ("" if predicting == len(result.batch.texts) else
                                                               "; a text of one token has no next token to predict"))
    heads = result.modules
    columns[1].metric("Heads", f"{sum(m.heads for m in heads):,}", help=f"{len(heads)} attention modules")
    if objective != "hidden":
        columns[2].metric("Loss without edits", f"{format_number(result.maps['zero'].clean)} nats",
                          help=imp.OBJECTIVES[objective])
    columns[3].metric("Measured in", f"{seconds:.1f} s")
    if cut:
        st.caption(f":material/content_cut: {cut} text(s) longer than {imp.MAX_TOKENS} tokens were read up to "
                   f"{imp.MAX_TOKENS}.")
    st.caption(f":material/start: {words.reading_words(tokenizer, objective)}")
    if objective == "masked":
        st.caption(f":material/content_copy: Each text is read in {result.batch.copies} copies, a different one "
                   f"in {imp.MASK_EVERY} of its ordinary tokens masked in each: every ordinary token is predicted "
                   "once, whatever the texts measured with it.")
    if objective == "hidden":
        st.info("This model has no head that gives a loss (an encoder without its language-model head): each "
                "ablation is measured by how far each token's final hidden state moves, over the mean size of its "
                "own text's unedited final states. Gradient importance needs a loss and is left out.",
                icon=":material/info:")


def heads_beside_labels(folder: str, name: str, result: imp.Study) -> None:
    """Every head's importance beside what it looks like: Explore heads' label and statistics of the head on the
    first text."""
    labels, statistics = {}, {}
    try:
        bundle = load_bundle(folder, name, model_dtype(name))
        capture = cached_capture(folder, name, result.batch.texts[0], None, bundle, max_tokens=imp.MAX_TOKENS,
                                 dtype=model_dtype(name))
        importance_page.add_head_labels(capture, labels, statistics)
    except (ValueError, RuntimeError) as problem:
        st.caption(f"Head labels are not available for this model: {problem_text(problem)}")
    with st.expander("Every head: what it looks like and what it costs", icon=":material/table:"):
        st.dataframe(ranking.head_rows(result, labels, statistics), hide_index=True, width="stretch")
        st.caption("Label and statistics: where the head looks on the first text, as Explore heads measures it "
                   "(shares of attention weight; entropy over the keys, normalised to 0-1; distance in tokens). "
                   "Ranks: 1 is the most important by that measure. A head can look like a pattern and matter "
                   "little, and the other way round.")


def token_effect_view(key: tuple, model, result: imp.Study) -> None:
    said = words.token_view(result.objective)
    st.subheader(said.heading)
    columns = st.columns([3, 2, 2, 4])
    labels = [module.label for module in result.modules]
    row = columns[0].selectbox("Layer", range(len(labels)), format_func=labels.__getitem__, key="imp_layer")
    head = columns[1].selectbox("Head", range(result.modules[row].heads), key="imp_head")
    how = columns[2].radio("Ablation", list(imp.ABLATIONS), key="imp_how", horizontal=True,
                           help="zero: the head's output set to 0; mean: to its mean over every token of the texts")
    text = 0
    if len(result.batch.texts) > 1:
        text = columns[3].selectbox("Text", range(len(result.batch.texts)), key="imp_text",
                                    format_func=lambda i: result.batch.texts[i][:60])
    targets, change = cached_token_effect(key, row, head, how, text, model, result)
    if not targets:
        st.info(said.empty, icon=":material/short_text:")
        return
    label = f"{labels[row]}, head {head}"
    tokens = result.batch.tokens[text]
    st.html(figures.token_effect_html(targets, change.tolist(),
                                      first=tokens[0] if result.objective == "next-token" else None))
    show_figure(figures.token_effect_chart(
        targets, change.tolist(), title=f"What {label} does for each token ({how} ablation)", measure=said.measure,
        axis=said.axis), said.caption, key="imp_tokens")
    st.markdown(words.token_summary(change, result.maps[how], row, head, text,
                                    "" if result.objective == "hidden" else "nats"))


def circuit_view(folder: str, name: str, model, tokenizer, objective: str) -> None:
    if objective != "next-token":
        st.info("The induction circuit lives in decoders: choose one (the bundled tiny GPT shows it in two layers).",
                icon=":material/info:")
        return
    columns = st.columns([2, 2, 5])
    period = columns[0].slider("Random tokens, typed twice", 10, 100, 50, 10, key="imp_circuit_period")
    seed = columns[1].number_input("Seed", 0, 10_000, 11, key="imp_circuit_seed")
    pool = circuits.ordinary_token_ids(tokenizer)
    result, scores, composed = cached_circuit(folder, name, period, seed, tokenizer.bos_token_id, model, pool)
    labels = [f"L{module.index} H{head}" for module in result.modules for head in range(module.heads)]
    first, second = importance_page.copy_losses(result)
    show_figure(figures.circuit_chart(labels, first, second, result.clean_first, result.clean_second,
                                      title="The loss on each copy with one head removed"),
                "A head whose removal lifts only the red bar is needed for copying; dashed: no head removed.",
                key="imp_circuit")
    bos = None if tokenizer.bos_token_id is None else tokenizer.bos_token
    st.markdown(ind.story(result, scores, period, composed=composed, bos=bos))  # the figure in words, under it
    rows, helps = importance_page.circuit_table(result, scores, composed, labels)
    st.dataframe(rows, hide_index=True, width="stretch",
                 column_config={name: st.column_config.NumberColumn(name, help=text) for name, text in helps.items()})
    st.caption("Pattern beside cause: where each head looks (its attention scores, Olsson et al. 2022) and what "
               "its removal costs. A head can attend like an induction head and matter less than another.")


def main() -> None:
    start_page("Does this head matter?")
    switch_if_asked()
    keep_form()  # the views' forms keep their values while another view is shown
    page_intro(
        "Attention weights say where a head looks, not whether the model needs it. Here heads are removed one at a "
        "time (their output zeroed, or replaced by its mean) and the loss measured again; gradient importance "
        "(Michel et al., 2019) asks the same of a gate on each head with one backward pass; activation patching puts a "
        "head's output from a clean input into a corrupted one and measures how much of the answer comes back. Every "
        "edit acts on the head's output before the output projection mixes the heads, through the attention function "
        "attnviz records with."
    )
    model_column, view_column = st.columns([3, 4])  # one row: the figure of the view sits on a projector's first screen
    name, folder = choose_model(model_column)
    try:
        model, tokenizer, head_note = editable_model(folder, name, model_dtype(name))
    except Exception as problem:  # noqa: BLE001 - a checkpoint that cannot load with its head: said, not raised
        st.error(f"**{name}** could not be loaded for editing: {problem_text(problem)}", icon=":material/block:")
        st.stop()
    reason = editable(model)
    if reason:
        st.warning(f"**{name}** cannot be edited here: {reason}.", icon=":material/block:")
        st.stop()
    objective = imp.objective_of(model)
    st.caption(f"Measured by the {imp.OBJECTIVES[objective]}.{' ' + head_note if head_note else ''}")
    view = view_column.segmented_control("View", VIEWS, default=VIEWS[0], key="imp_view", required=True)
    {"Induction circuit": circuit_view, "Importance map": importance_view,
     "Activation patching": experiment_view}[view](folder, name, model, tokenizer, objective)


main()
