"""The "Over training" page's words and figures on runs built here row by row: the phase change, the heads and every
number in a sentence come from the rows (attnviz.pagelogic.over_training, attnviz.viz.over_training)."""

import math

import numpy as np
import pytest

from attnviz.interventions import training_measures as tm
from attnviz.interventions.training_runs import Run
from attnviz.pagelogic import over_training as ot
from attnviz.viz import over_training as figures

STEPS = [0, 10, 100, 400, 1000]
LAYERS, HEADS = 2, 2


def _grid(value: float, at: tuple[int, int], rest: float) -> list[list[float]]:
    return [[value if (layer, head) == at else rest for head in range(HEADS)] for layer in range(LAYERS)]


def _rows(induction=(0.02, 0.03, 0.02, 0.7, 0.72), previous=(0.05, 0.2, 0.6, 0.8, 0.9), *, icl=(0.1, 0.12, 0.15,
          -0.2, -0.3), loss=(8.0, 7.0, 6.0, 5.0, 4.0), cost=(0.0, 0.01, 0.02, 1.5, 2.0),
          copy=(8.1, 7.5, 7.0, 3.0, 2.5)) -> list[dict]:
    """A run of 2 x 2 heads: L1 H1's induction score and ablation cost, L0 H0's previous-token score as given, the
    other heads flat."""
    return [{"step": step, "loss": loss[i], "icl": icl[i], "early_loss": loss[i], "late_loss": loss[i] + icl[i],
             "copy_loss": copy[i], "previous_token": _grid(previous[i], (0, 0), 0.03),
             "induction": _grid(induction[i], (1, 1), 0.04), "duplicate_token": _grid(0.05, (0, 1), 0.05),
             "ablation_cost": _grid(cost[i], (1, 1), 0.001)} for i, step in enumerate(STEPS)]


def _run(rows, checkpoints=None, name=ot.BUNDLED_RUN_NAME) -> Run:
    return Run(name, rows, tm.phase_change([row["step"] for row in rows], [row["induction"] for row in rows]),
               checkpoints or {})


def test_a_step_the_rule_names_twice_is_said_once():
    # 0.02 -> 0.6 -> 0.72: step 400 is past 10% and past half of the rise, step 1,000 past 90%
    run = _run(_rows(induction=(0.02, 0.03, 0.02, 0.6, 0.72)))
    assert (run.phase.start, run.phase.middle, run.phase.end) == (400, 400, 1000)
    phase = ot.phase_words(run)
    assert "**The phase change runs from step 400 to step 1,000**" in phase
    assert ("L1 H1's induction score is 0.6 at step 400 (10% of its rise and half) and 0.72 at step 1,000 (90%); "
            "0.02 at step 100, the last measured step before") in phase


def test_a_rise_from_0_02_to_0_7_between_steps_100_and_400_is_the_phase_change_and_the_words_say_so():
    run = _run(_rows())
    assert (run.phase.layer, run.phase.head, run.phase.before, run.phase.start, run.phase.end) == (1, 1, 100, 400, 400)
    phase = ot.phase_words(run)
    assert "**The phase change falls between step 100 and step 400**" in phase
    assert "L1 H1's induction score jumps from 0.02 at step 100 to 0.7 at step 400" in phase
    assert "0.72 (at step 1,000)" in phase  # its highest, where it is
    assert ot.rising_heads(run.rows) == [ot.Rise(1, 1, 100, 0.02, 400, 0.7)]
    assert "**L1 H1** from 0.02 at step 100 to 0.7 at step 400" in ot.induction_words(run)
    assert ot.induction_heads(run) == [(1, 1)]
    assert ot.shaded_span(run) == (100, 400)
    assert ot.default_step(run) == 400
    # the ICL score and the loss before (step 100) and after (step 400) it, as the rows hold them
    icl = ot.icl_words(run)
    assert "**+0.15** at step 100, before the phase change, and **−0.2** at step 400, after it" in icl
    assert "it moves by −0.35 across the phase change, and by −0.1 from there to the last step" in icl
    loss = ot.loss_words(run)
    assert "8.00 at step 0" in loss and "6.00 at step 100 (before the phase change)" in loss
    assert "5.00 at step 400 (after it)" in loss and "4.00 at step 1,000 (the last)" in loss
    assert "falls by 1.00 across the phase change, 25% of its fall over the whole run (4.00)" in loss
    previous = ot.previous_token_words(run)
    assert "**L0 H0** reaches 0.5 at step 100 (0.6; 0.05 at step 0, 0.9 at the last step)" in previous
    assert "before the phase change starts (step 400)" in previous
    assert ot.previous_token_heads(run) == [(0, 0)]
    ablation = ot.ablation_words(run)
    assert "**L1 H1** +0.02 → +1.5 (+2 at the last step)" in ablation and "7.00 → 3.00 nats" in ablation
    assert tm.PHASE_RULE in ot.rule_words()


def test_a_flat_run_has_no_phase_change_and_says_what_its_scores_do():
    run = _run(_rows(induction=(0.02, 0.03, 0.04, 0.05, 0.06), previous=(0.03,) * 5))
    assert run.phase is None and ot.shaded_span(run) is None and ot.default_step(run) == 1000
    phase = ot.phase_words(run)
    assert phase.startswith("**No phase change** is marked")
    assert "**L1 H1**, goes from 0.02 at step 0 to at most 0.06 (at step 1,000)" in phase
    induction = ot.induction_words(run)
    assert induction.startswith("No head's induction score rises from under 0.1 to over 0.5")
    assert "The highest any head reaches is 0.06 (**L1 H1** at step 1,000)" in induction
    assert ot.induction_heads(run) == [] and ot.ablation_words(run) == ""
    assert "**+0.1** at step 0, the first measured step, and **−0.3** at step 1,000, the last" in ot.icl_words(run)
    assert "No head is a **previous-token head**" in ot.previous_token_words(run)
    assert len(ot.run_words(run)) == 5


def test_a_head_that_starts_high_is_no_rise():
    """Over 0.5 without ever being under 0.1 before: not named as rising (the phase change is still placed)."""
    run = _run(_rows(induction=(0.15, 0.2, 0.3, 0.7, 0.72)))
    assert ot.rising_heads(run.rows) == []
    assert run.phase is not None and ot.induction_heads(run) == [] and ot.followed_heads(run) == [(1, 1)]
    assert ot.ablation_words(run).startswith("**Zeroing the head the phase change follows**")  # not an induction head
    assert ot.head_to_open(run, 1000) == (1, 1)
    assert "The highest any head reaches is 0.72 (**L1 H1** at step 1,000); that head's lowest before then is 0.15 " \
           "(at step 0)" in ot.induction_words(run)


def test_rows_become_arrays_and_a_step_its_numbers():
    run = _run(_rows())
    assert ot.steps_of(run.rows) == STEPS
    assert ot.run_series(run.rows, "icl").tolist() == [0.1, 0.12, 0.15, -0.2, -0.3]
    induction = ot.head_series(run.rows, "induction")
    assert induction.shape == (5, LAYERS, HEADS) and induction[3, 1, 1] == 0.7
    table = ot.step_table(run, 400)
    assert list(table["head"]) == ["L0 H0", "L0 H1", "L1 H0", "L1 H1"]
    assert table.loc[3, "induction score"] == 0.7 and table.loc[0, "previous-token score"] == 0.8
    numbers = ot.step_numbers(run, 400)
    assert (numbers.loss, numbers.icl, numbers.copy_loss, numbers.best_induction, numbers.best_head) == (
        "5.00", "−0.2", "3.00", "0.7", "L1 H1")


def test_the_run_s_facts_and_the_head_the_buttons_open_come_from_the_run():
    run = _run(_rows(), checkpoints={100: "/a", 1000: "/b"})
    run.facts = {"seconds": 960.0, "threads": 2}
    assert ot.run_facts(run) == ("5 measured steps, from step 0 to step 1,000; checkpoints kept at steps 100 and "
                                 "1,000; its training steps took 16 min on 2 CPU threads.")
    assert ot.head_to_open(run, 100) == (1, 1)  # the induction head the words name
    flat = _run(_rows(induction=(0.02, 0.03, 0.04, 0.05, 0.06)))
    assert ot.head_to_open(flat, 1000) == (1, 1)  # none named: the highest induction score at that step


def test_the_buttons_say_which_kept_checkpoint_they_open():
    run = _run(_rows(), checkpoints={100: "/a", 1000: "/b"})
    assert ot.opened_words(run, 100) == "The buttons open the checkpoint kept at step 100 (this run keeps steps 100 " \
                                        "and 1,000)."
    assert "the buttons open **step 1,000**, the nearest to step 400" in ot.opened_words(run, 400)
    assert ot.opened_words(_run(_rows()), 400) == "This run keeps no checkpoint to open."
    assert ot.checkpoint_name(run, 1234) == "tiny GPT at step 1,234 (bundled run)"
    assert ot.checkpoint_name(_run(_rows(), name="my run"), 5) == "my run at step 5"
    assert ot.run_key(run) != ot.run_key(_run(_rows(icl=(0, 0, 0, 0, 0))))


def test_the_loss_figure_has_a_log_axis_that_shows_step_0_and_shades_the_phase_change():
    run = _run(_rows())
    figure = figures.loss_and_icl_figure(run.steps, ot.run_series(run.rows, "loss"), ot.run_series(run.rows, "icl"),
                                         span=ot.shaded_span(run), picked=100)
    assert figure.layout.xaxis.type == "log" and figure.layout.xaxis2.type == "log"
    assert figures.zero_position(STEPS) == 5  # half the first measured step
    assert list(figure.data[0].x) == [5, 10, 100, 400, 1000] and list(figure.data[0].customdata) == STEPS
    assert "step 0 drawn at 5" in figure.layout.xaxis2.title.text
    assert figure.layout.xaxis2.ticktext[0] == "0" and figure.layout.xaxis2.tickvals[0] == 5
    bands = [shape for shape in figure.layout.shapes if shape.type == "rect"]
    assert len(bands) == 2 and all((band.x0, band.x1) == (100, 400) for band in bands)  # both panels
    lines = [shape for shape in figure.layout.shapes if shape.type == "line" and shape.xref != "x2 domain"]
    assert len(lines) == 2 and all(line.x0 == line.x1 == 100 for line in lines)  # the picked step, both panels
    assert [trace.name for trace in figure.data] == ["held-out loss", "in-context-learning score"]
    assert len(figure.to_json()) < 2_000_000


def test_the_head_panels_draw_every_head_and_the_named_ones_strong():
    run = _run(_rows())
    measures = {title: ot.head_series(run.rows, measure) for measure, title in ot.HEAD_MEASURE_TITLES.items()}
    figure = figures.head_panels_figure(run.steps, measures, named=[(1, 1)], span=ot.shaded_span(run), picked=0,
                                        ranges=ot.SCORE_RANGES)
    assert len(figure.data) == 4 * 2  # in each of the four panels: the other heads, then the named one
    assert [annotation.text for annotation in figure.layout.annotations][:4] == list(measures)
    named = [trace for trace in figure.data if trace.name == "L1 H1"]
    assert len(named) == 4 and all(trace.line.color == figures.STRONG[0] for trace in named)
    assert [trace.name for trace in figure.data if trace.showlegend] == ["L1 H1"]
    induction = next(trace for trace in named if trace.yaxis == "y2")  # the second panel: the induction scores
    assert np.allclose(induction.y, [0.02, 0.03, 0.02, 0.7, 0.72])
    # every other head a line of its own in one faint trace, split by gaps, its hover naming the head and step
    faint = next(trace for trace in figure.data if trace.name == "other heads" and trace.yaxis == "y2")
    assert faint.line.color == figures.FAINT and faint.opacity < 1 and not faint.connectgaps
    lines = np.split(np.asarray(faint.y, dtype=float), np.flatnonzero(np.isnan(np.asarray(faint.y, dtype=float))))
    assert [len(line[~np.isnan(line)]) for line in lines if np.isfinite(line).any()] == [5, 5, 5]
    where = np.asarray(faint.customdata)
    assert {tuple(row[1:]) for row in where if row[0] >= 0} == {(0, 0), (0, 1), (1, 0)}
    assert np.allclose(np.asarray(faint.y, dtype=float)[:5], [0.04] * 5) and list(where[:5, 0]) == STEPS
    bands = [shape for shape in figure.layout.shapes if shape.type == "rect"]
    assert len(bands) == 4 and {(band.x0, band.x1) for band in bands} == {(100, 400)}
    lines = [shape for shape in figure.layout.shapes if shape.type == "line"]
    assert len(lines) == 4 and {line.x0 for line in lines} == {5}  # step 0, where it is drawn
    assert all(axis.type == "log" for axis in figure.select_xaxes())
    assert tuple(figure.layout.yaxis2.range) == ot.WEIGHT_RANGE  # a score panel: 0 to 1
    assert figure.layout.yaxis4.range is None  # the ablation cost: its own spread
    assert len(figure.to_json()) < 2_000_000


@pytest.mark.parametrize("steps", [[0, 4, 5, 7500], [0], [3, 30, 300], [3122, 3720, 4433]])
def test_every_step_has_a_place_on_the_log_axis(steps):
    placed = figures.positions(steps)
    assert all(x > 0 and math.isfinite(x) for x in placed) and placed == sorted(placed)
    values, labels = figures._ticks(steps)
    assert values == sorted(values) and len(values) == len(set(values))
    assert (labels[0] == "0") == (0 in steps)  # a series that starts later draws no step 0
    assert len(values) >= 2 or steps == [0]
    title = figures.axis_title(steps)
    assert ("step 0 drawn at" in title) == (0 in steps)


def test_what_a_sceptic_tried_reads_true():
    """Runs built to break the words: each sentence still says what its numbers show."""
    nan = float("nan")
    # a diverged checkpoint: no crash, and its numbers read as no value, never as '−' or 'nan'
    run = _run(_rows(induction=(0.02, nan, 0.02, 0.7, 0.72), icl=(0.1, nan, 0.15, -0.2, -0.3),
                     loss=(8.0, nan, 6.0, 5.0, 4.0)))
    assert run.phase is not None and run.phase.end == 400
    for sentence in ot.run_words(run):
        assert "nan" not in sentence.lower() and "− " not in sentence and "−." not in sentence, sentence
    assert ot._signed(nan) == ot._n(float("inf")) == ot.NOT_FINITE
    # a loss that falls more across the phase change than over the whole run: no share over 100%
    loss = ot.loss_words(_run(_rows(loss=(8.0, 7.0, 4.0, 1.0, 6.5))))
    assert "falls by 3.00 across the phase change, more than it falls over the whole run (1.50)" in loss
    assert "%" not in loss
    assert "barely moves across the phase change" in ot.loss_words(_run(_rows(loss=(8.0, 7.0, 5.0, 5.001, 4.0))))
    # numbers beside a threshold keep the digits that put them on its side
    close = _run(_rows(induction=(0.02, 0.03, 0.0999, 0.50004, 0.72)))
    assert "to 0.50004 at step 400" in ot.induction_words(close)
    # exactly 0.5 is a previous-token head, as Explore heads labels it; one over it from the start is not 'becoming'
    at_threshold = ot.previous_token_words(_run(_rows(previous=(0.05, 0.2, 0.3, 0.4, 0.5))))
    assert "**L0 H0** reaches 0.5 at step 1,000" in at_threshold
    from_start = ot.previous_token_words(_run(_rows(previous=(0.9, 0.9, 0.9, 0.9, 0.9))))
    assert "is at 0.5 or over already at the first measured step (0.9 at step 0" in from_start
    assert "reaches" not in from_start
    # a head that falls after its peak: where it ends is said
    falling = ot.phase_words(_run(_rows(induction=(0.8, 0.7, 0.6, 0.5, 0.45))))
    assert "**No phase change**" in falling and "and is 0.45 at the last step" in falling
    # the run's facts: one step, a short run, a long one
    one = Run("one", [_rows()[0]], None, {}, {"seconds": 20.0, "threads": 1})
    assert ot.run_facts(one) == "1 measured step, step 0; its training steps took under 1 min on 1 CPU thread."
    assert "16,667 min" in ot.run_facts(Run("long", _rows(), None, {}, {"seconds": 1e6}))
    assert "step 0 drawn at 50,000" in figures.axis_title([0, 100_000, 1_000_000])
