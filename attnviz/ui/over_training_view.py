"""The "Over training" page's view: a training run (the bundled tiny GPT's own, or a series of checkpoints) as figures
against the step, the sentences read off its numbers, and one step's numbers with buttons that open the nearest kept
checkpoint in Explore heads or Generation."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from attnviz.interventions.training_runs import Run, bundled_run
from attnviz.models.shipped import BUNDLED_GPT_DIR
from attnviz.pagelogic import over_training as words
from attnviz.ui.figures import figure_once, show_figure
from attnviz.ui.frame import page_intro, setup_area
from attnviz.ui.norm_placement_view import norm_placement_section
from attnviz.ui.open_in_explore import ask_to_open
from attnviz.ui.open_in_generation import ask_to_generate
from attnviz.ui.session_models import register_model, registered_models
from attnviz.viz import over_training as figures

SOURCES = {"bundled": "The bundled tiny GPT's own run", "series": "A series of checkpoints"}
BUNDLED_RUN_FOLDER = BUNDLED_GPT_DIR  # where the bundled run is read from (tests point it at a run of their own)
INTRO = ("How the heads the other pages show came to be. The bundled tiny GPT was measured while it trained, at "
         "steps spaced evenly on a log scale: its held-out loss, how much better it predicts late tokens of a text "
         "than early ones (in-context learning), and every head's previous-token, induction and duplicate-token "
         "scores and what zeroing it costs on a repeated sequence. Pick a step to read its numbers, and open the "
         "checkpoint kept nearest to it on the other pages.")


@st.cache_data(max_entries=4, show_spinner=False)
def cached_bundled_run(folder: str, mtime: float) -> Run | None:
    """The bundled run read from ``folder`` once per version of its measures (``mtime``: the file's)."""
    return bundled_run(Path(folder))


def chosen_run() -> tuple[Run, str] | None:
    """The run the source control picks, with the key of its cached figures; None (said) when there is none."""
    with setup_area("The run"):  # on a projector, the phase change comes first
        source = st.segmented_control("Run", list(SOURCES), format_func=SOURCES.get, default="bundled",
                                      key="ot_source", required=True, bind="query-params",
                                      help="The bundled tiny GPT, measured while it trained; or checkpoints of "
                                           "a run of yours, measured here in the background.")
    if source == "series":
        try:
            from attnviz.ui.over_training_series import series_source
        except ImportError:
            st.info("Measuring a series of checkpoints is not available in this version: choose the bundled tiny "
                    "GPT's own run.", icon=":material/info:")
            return None
        run = series_source()
        return None if run is None or not run.rows else (run, words.run_key(run))
    folder = Path(BUNDLED_RUN_FOLDER)
    mtime = words.measures_mtime(folder)
    run = cached_bundled_run(str(folder), mtime) if mtime else None
    if run is None or not run.rows:
        st.info("The bundled tiny GPT carries no record of its training (its folder has no "
                "over-training/measures.json): train it again with `attnviz train-tiny`, which measures it as it "
                "trains.", icon=":material/info:")
        return None
    return run, f"{folder}:{mtime}"


def chosen_step(run: Run) -> int:
    """The step slider: the measured steps, opening on the end of the phase change."""
    if len(run.steps) == 1:
        st.caption(f"This run was measured at one step only, step {run.steps[0]:,}.")
        return run.steps[0]
    if st.session_state.get("ot_step") not in run.steps:  # another run's step (or none yet)
        st.session_state.pop("ot_step", None)
    return int(st.select_slider(
        "Step", run.steps, value=words.default_step(run), key="ot_step", format_func=str,  # plain digits: ?ot_step=1091
        bind="query-params",
        help="A measured step: its line on the figures, its numbers below. The page opens at the end of the phase "
             "change (the last step where there is none)."))


def show_figures(run: Run, key: str, step: int) -> None:
    """The two figures, each built once per run (cached, shared by sessions) and marked at ``step`` on a cheap copy
    (cached too): a move of the slider sends them without building them again."""
    steps, span = run.steps, words.shaded_span(run)
    named, followed = words.induction_heads(run), words.followed_heads(run)
    previous = [head for head in words.previous_token_heads(run) if head not in named + followed]
    shaded = ("Shaded: the phase change, from the last measured step before the rise to the step where it reached "
              "90%. " if span else "")
    loss = figure_once(("over training loss", key), lambda: figures.loss_and_icl_figure(
        steps, words.run_series(run.rows, "loss"), words.run_series(run.rows, "icl"), span=span,
        early=words.run_series(run.rows, "early_loss"), late=words.run_series(run.rows, "late_loss")))
    show_figure(figure_once(("over training loss", key, step), lambda: figures.marked(loss, steps, step)),
                shaded + "Below 0, the in-context-learning score says later tokens are predicted better than early "
                "ones; dashed: the step picked below.", key="ot_loss")
    heads = figure_once(("over training heads", key), lambda: figures.head_panels_figure(
        steps, {title: words.head_series(run.rows, measure) for measure, title in words.HEAD_MEASURE_TITLES.items()},
        named=named + followed + previous, span=span, ranges=words.SCORE_RANGES))
    show_figure(figure_once(("over training heads", key, step), lambda: figures.marked(heads, steps, step)),
                figures_caption(named, previous, followed) + shaded + "Scores: the mean attention weight on the "
                "detector's keys; ablation cost: how much the second copy's loss rises when the head is zeroed.",
                key="ot_heads")


def figures_caption(induction: list[tuple[int, int]], previous: list[tuple[int, int]],
                    followed: list[tuple[int, int]] = ()) -> str:
    """Which heads the small multiples draw in strong colours (those the words name)."""
    said = [f"{', '.join(words.head_label(*head) for head in heads)} ({kind}{'s' * (len(heads) > 1)})"
            for heads, kind in ((induction, "induction head"), (list(followed), "the head the phase change follows"),
                                (previous, "previous-token head")) if heads]
    if not said:
        return "One faint line per head. "
    return f"Strong colours: {' and '.join(said)}, as named below; faint: every other head. "


def show_words(run: Run) -> None:
    st.subheader("What the numbers say")
    for sentence in words.run_words(run):
        st.markdown(sentence)
    st.caption(words.rule_words())
    st.caption(f":material/timeline: {words.run_facts(run)}")


def open_checkpoint(page: str, run: Run, step: int, head: tuple[int, int]) -> None:
    """Callback: the checkpoint kept at ``step`` becomes a model of this session (the one already registered for its
    folder, if any), then ``page`` opens on it with a sentence typed twice."""
    folder = Path(run.checkpoints[step])
    name = registered_name(folder)
    if name is None:
        name = register_model(words.checkpoint_name(run, step), folder, owned=False, dtype="fp32")
    if page == "explore":
        ask_to_open(words.REPEATED_SENTENCE, name, *head)
    else:
        ask_to_generate(words.REPEATED_SENTENCE, name)


def registered_name(folder: Path) -> str | None:
    """The name this session's models already give ``folder``, if any."""
    wanted = folder.resolve()
    return next((name for name, there in registered_models().items() if Path(there).resolve() == wanted), None)


def step_view(run: Run, step: int) -> None:
    """The numbers of one step, and the buttons that open its nearest kept checkpoint."""
    numbers = words.step_numbers(run, step)
    columns = st.columns(4)
    columns[0].metric("Held-out loss", numbers.loss, help="nats per token, on held-out windows of 128 tokens")
    columns[1].metric("In-context-learning score", numbers.icl,
                      help="the loss on late tokens minus that on early ones: below 0, more context helps")
    columns[2].metric("Second copy's loss", numbers.copy_loss,
                      help="nats per token, on the second copy of random tokens typed twice")
    columns[3].metric("Highest induction score", numbers.best_induction, help=f"{numbers.best_head}, at this step")
    table = words.step_table(run, step)
    rows_shown = min(len(table), 16)  # the tiny GPT's 12 heads without a scroll bar
    st.dataframe(table, hide_index=True, width="stretch", height=36 * (rows_shown + 1) + 3,
                 column_config={column: st.column_config.NumberColumn(format="%.3g") for column in table.columns[1:]})
    nearest = run.nearest_checkpoint(step)
    st.caption(words.opened_words(run, step))
    head = words.head_to_open(run, nearest if nearest is not None else step)
    left, right = st.columns(2)
    left.button("Open in Explore heads", key="ot_explore", icon=":material/search:", disabled=nearest is None,
                on_click=open_checkpoint, args=("explore", run, nearest, head),
                help=f"Explore heads on the checkpoint kept nearest this step, with “{words.REPEATED_SENTENCE}”, "
                     f"at {words.head_label(*head)}: the induction stripe, where the head has learned one.")
    right.button("Open in Generation", key="ot_generation", icon=":material/edit_note:", disabled=nearest is None,
                  on_click=open_checkpoint, args=("generation", run, nearest, head),
                  help=f"Generation with this checkpoint and the prompt “{words.REPEATED_SENTENCE}”.")


def over_training_view() -> None:
    page_intro(INTRO)
    chosen = chosen_run()
    if chosen is not None:
        run_view(*chosen)
    st.divider()
    norm_placement_section()  # the same log step axis, for a question about every transformer's training


def run_view(run: Run, key: str) -> None:
    """A run's figures, words and one step's numbers."""
    figures_area, words_area, step_area = st.container(), st.container(), st.container()
    with step_area:
        st.subheader("One step")
        step = chosen_step(run)  # first: the figures mark it
    with figures_area:
        show_figures(run, key, step)
    with words_area:
        show_words(run)
    with step_area:
        step_view(run, step)
