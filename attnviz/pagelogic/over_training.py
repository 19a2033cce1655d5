"""What the "Over training" page computes and says about a training run
(:class:`attnviz.interventions.training_runs.Run`): its rows as arrays per measure, the heads whose induction score
rises, and sentences in which every number is read off the rows shown (the phase change where
:data:`attnviz.interventions.training_measures.PHASE_RULE` puts it, the induction heads, the in-context-learning score
and the held-out loss across it, the previous-token heads, the induction heads' ablation cost before and after).
Nothing is said from what the literature predicts. No Streamlit: the page draws these."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from attnviz.core.analysis import LABEL_RULES
from attnviz.interventions import training_measures as tm
from attnviz.interventions.training_runs import MEASURES_FILE, SERIES_DIR, Run
from attnviz.viz.style import format_number

# What each measure is called on the page (the figures' panels, the table's columns)
HEAD_MEASURE_TITLES = {"previous_token": "previous-token score", "induction": "induction score",
                       "duplicate_token": "duplicate-token score", "ablation_cost": "ablation cost (nats)"}
WEIGHT_RANGE = (0.0, 1.02)  # the scores are shares of attention weight: every run on the same axis
SCORE_RANGES = {HEAD_MEASURE_TITLES[measure]: WEIGHT_RANGE for measure in ("previous_token", "induction",
                                                                             "duplicate_token")}
RUN_MEASURE_TITLES = {"loss": "held-out loss (nats)", "icl": "in-context-learning score (nats)",
                      "early_loss": f"loss on tokens {tm.EARLY[0]}-{tm.EARLY[1] - 1} (nats)",
                      "late_loss": f"loss on tokens {tm.LATE[0]}-{tm.LATE[1] - 1} (nats)",
                      "copy_loss": "loss on the second copy (nats)"}
RISE_FROM, RISE_TO = 0.1, 0.5  # an induction head: its score rises from under RISE_FROM to over RISE_TO
PREVIOUS_TOKEN = LABEL_RULES["previous-token head"][1]  # Explore heads' threshold for a previous-token head
REPEATED_SENTENCE = "The cat sat on the mat. The cat sat on the mat."  # what the buttons open: a sentence typed twice
BUNDLED_RUN_NAME = "the bundled tiny GPT's own run"  # training_runs.bundled_run's name


def head_label(layer: int, head: int) -> str:
    return f"L{layer} H{head}"


def steps_of(rows: list[dict]) -> list[int]:
    return [int(row["step"]) for row in rows]


def run_series(rows: list[dict], measure: str) -> np.ndarray:
    """``[steps]``: one of the run's own measures (``loss``, ``icl``, ...) at each measured step."""
    return np.array([float(row[measure]) for row in rows], dtype=np.float64)


def head_series(rows: list[dict], measure: str) -> np.ndarray:
    """``[steps, layers, heads]``: one of the heads' measures (:data:`attnviz.interventions.training_measures.
    HEAD_MEASURES`) at each measured step."""
    return np.array([row[measure] for row in rows], dtype=np.float64)


def run_key(run: Run) -> str:
    """A short digest of everything the page draws from ``run``: the key of its cached figures."""
    text = json.dumps([run.name, run.rows, sorted((step, str(folder)) for step, folder in run.checkpoints.items())],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def measures_mtime(folder: Path) -> float:
    """When a run folder's measures were written (0 when it has none): the bundled run's cache key, with the path."""
    path = Path(folder) / SERIES_DIR / MEASURES_FILE
    return path.stat().st_mtime if path.is_file() else 0.0


def _listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _step(step: int) -> str:
    return f"step {step:,}"


NOT_FINITE = "no finite value"  # what a diverged checkpoint's number reads as


def _n(value: float) -> str:
    value = float(value)
    return format_number(value) if np.isfinite(value) else NOT_FINITE


def _signed(value: float) -> str:
    """A signed number for reading: ``+0.12``, ``−0.35``, ``0``."""
    value = float(value)
    if not np.isfinite(value):
        return NOT_FINITE
    text = format_number(abs(value))
    return text if text == "0" else ("+" if value > 0 else "−") + text


def _nats(value: float) -> str:
    """A loss, to two decimals (4.00, not 4)."""
    return f"{float(value):.2f}" if np.isfinite(float(value)) else NOT_FINITE


def _beside(value: float, threshold: float) -> str:
    """``value`` with enough digits not to read as ``threshold`` itself (0.50004 beside 'over 0.5': 0.50004)."""
    text = _n(value)
    for digits in (4, 6, 9):
        if text != format_number(threshold) or value == threshold:
            break
        text = f"{value:.{digits}g}"
    return text


# -- the heads ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rise:
    """A head whose score went from under :data:`RISE_FROM` (``low`` at ``low_step``, the last measured step under it
    before ``high_step``) to over :data:`RISE_TO` (``high`` at ``high_step``, the first measured step over it)."""

    layer: int
    head: int
    low_step: int
    low: float
    high_step: int
    high: float

    @property
    def label(self) -> str:
        return head_label(self.layer, self.head)


def rising_heads(rows: list[dict], measure: str = "induction", below: float = RISE_FROM,
                 above: float = RISE_TO) -> list[Rise]:
    """The heads whose ``measure`` is under ``below`` at some measured step and over ``above`` at a later one, in
    the order they got there (then by layer and head)."""
    steps, scores = steps_of(rows), head_series(rows, measure)  # [steps, layers, heads]
    found = []
    if scores.size == 0:
        return found
    for layer in range(scores.shape[1]):
        for head in range(scores.shape[2]):
            curve = scores[:, layer, head]
            for index in np.flatnonzero(curve > above):
                earlier = np.flatnonzero(curve[:index] < below)
                if earlier.size:
                    low = int(earlier[-1])
                    found.append(Rise(layer, head, steps[low], float(curve[low]), steps[index], float(curve[index])))
                    break
    return sorted(found, key=lambda rise: (rise.high_step, rise.layer, rise.head))


def induction_heads(run: Run) -> list[tuple[int, int]]:
    """The heads the words name as induction heads: those whose score rises (:func:`rising_heads`)."""
    return [(rise.layer, rise.head) for rise in rising_heads(run.rows)]


def followed_heads(run: Run) -> list[tuple[int, int]]:
    """Where no head's score rises to an induction head's, the head the phase change follows (named as that, not as
    an induction head); else none."""
    if induction_heads(run) or run.phase is None:
        return []
    return [(run.phase.layer, run.phase.head)]


def previous_token_heads(run: Run) -> list[tuple[int, int]]:
    """The heads the words name as previous-token heads: a previous-token score of :data:`PREVIOUS_TOKEN` or more at the
    last step, in the order they first passed it."""
    return [(layer, head) for _, layer, head, *_ in _formed_previous_token_heads(run)]


def _formed_previous_token_heads(run: Run) -> list[tuple[int, int, int, float, float, float]]:
    """(the first step over the threshold, layer, head, the score then, at the first step, at the last) of each head
    at :data:`PREVIOUS_TOKEN` or over at the last step, by that first step."""
    steps, scores = run.steps, head_series(run.rows, "previous_token")  # [steps, layers, heads]
    formed = []
    if scores.size == 0:
        return formed
    for layer in range(scores.shape[1]):
        for head in range(scores.shape[2]):
            curve = scores[:, layer, head]
            if curve[-1] >= PREVIOUS_TOKEN:  # Explore heads labels a head at the threshold too
                index = int(np.flatnonzero(curve >= PREVIOUS_TOKEN)[0])
                formed.append((steps[index], layer, head, float(curve[index]), float(curve[0]), float(curve[-1])))
    return sorted(formed)


def _index(rows: list[dict], step: int) -> int:
    return steps_of(rows).index(step)


def _before_after(run: Run) -> tuple[int, int, str, str]:
    """The two steps the words compare, and what each is called: the last measured step before the phase change
    and its end (at 90%), or the first and the last step when there is none."""
    steps = run.steps
    phase = run.phase
    if phase is None:
        return steps[0], steps[-1], "the first measured step", "the last"
    before = phase.before if phase.before is not None else steps[0]
    return before, phase.end, "before the phase change", "after it"


def shaded_span(run: Run) -> tuple[int, int] | None:
    """The steps the figures shade: from the last measured step before the phase change (where it starts at the
    first step: that step) to the first at 90% of the rise; None without a phase change."""
    if run.phase is None:
        return None
    return (run.phase.before if run.phase.before is not None else run.phase.start), run.phase.end


# -- the words ----------------------------------------------------------------------------------------------------
def rule_words() -> str:
    return "The rule: " + tm.PHASE_RULE + "."


def phase_words(run: Run) -> str:
    """Where the phase change is, by the rule, with the followed head's scores at the steps the rule names."""
    rows, phase = run.rows, run.phase
    scores = head_series(rows, "induction")  # [steps, layers, heads]
    steps = run.steps
    if scores.size == 0:
        return "This run has no induction scores: no phase change can be placed."
    if phase is None:
        followed = tm.followed_head(scores)
        if followed is None:
            return "**No phase change** is marked: no head has a finite induction score at the last step."
        layer, head = followed
        curve = np.where(np.isfinite(scores[:, layer, head]), scores[:, layer, head], -np.inf)
        said = (f"**No phase change** is marked: the head with the highest induction score at the last step, "
                f"**{head_label(layer, head)}**, goes from {_n(scores[0, layer, head])} at {_step(steps[0])} to at "
                f"most {_n(curve.max())} (at {_step(steps[int(curve.argmax())])}), a rise of less than "
                f"{format_number(tm.LEAST_RISE)}, and is {_n(curve[-1])} at the last step")
        rises = [rise for rise in rising_heads(rows) if (rise.layer, rise.head) != (layer, head)]
        if rises:
            said += (f" (the rule follows that head; {_listed([f'**{rise.label}**' for rise in rises])}, whose "
                     "score rises as below, is not the highest at the last step)")
        return said + "."
    curve = scores[:, phase.layer, phase.head]

    def at(step: int) -> str:
        return f"{_n(curve[_index(rows, step)])} at {_step(step)}"

    label = head_label(phase.layer, phase.head)
    if phase.start == phase.end:
        where = (f"**The phase change falls between {_step(phase.before)} and {_step(phase.end)}**"
                 if phase.before is not None else f"**The phase change is at {_step(phase.end)}**")
        how = f"{label}'s induction score jumps from {at(phase.before)} to {at(phase.end)}" if phase.before \
            is not None else f"{label}'s induction score is {at(phase.end)}"
    else:
        where = f"**The phase change runs from {_step(phase.start)} to {_step(phase.end)}**"
        marks: dict[int, list[str]] = {}  # a step the rule names twice (10% and half at once) is said once
        for step, share in ((phase.start, "10% of its rise"), (phase.middle, "half"), (phase.end, "90%")):
            marks.setdefault(step, []).append(share)
        said = [f"{at(step)} ({' and '.join(shares)})" for step, shares in marks.items()]
        how = f"{label}'s induction score is {', '.join(said[:-1])} and {said[-1]}"
        if phase.before is not None:
            how += f"; {at(phase.before)}, the last measured step before"
    return (f"{where}: {how}. It rises from {_n(phase.low)} at {_step(steps[0])} to its highest, {_n(phase.high)} "
            f"(at {_step(steps[int(curve.argmax())])}).")


def induction_words(run: Run) -> str:
    """Which heads' induction scores rise from under 0.1 to over 0.5, with the steps and scores; or what the scores
    do when none does."""
    rises = rising_heads(run.rows)
    if rises:
        each = "; ".join(f"**{rise.label}** from {_beside(rise.low, RISE_FROM)} at {_step(rise.low_step)} to "
                         f"{_beside(rise.high, RISE_TO)} at {_step(rise.high_step)}" for rise in rises)
        heads = "One head's induction score rises" if len(rises) == 1 else f"{len(rises)} heads' induction scores rise"
        return (f"{heads} from under {format_number(RISE_FROM)} to over "
                f"{format_number(RISE_TO)}: {each} (the last measured step under, the first over).")
    scores = head_series(run.rows, "induction")
    if scores.size == 0:
        return "This run has no induction scores."
    index, layer, head = np.unravel_index(int(scores.argmax()), scores.shape)
    said = (f"No head's induction score rises from under {format_number(RISE_FROM)} to over "
            f"{format_number(RISE_TO)}. The highest any head reaches is {_n(scores.max())} "
            f"(**{head_label(int(layer), int(head))}** at {_step(run.steps[index])})")
    if index == 0:
        return said + ", at the first measured step."
    curve = scores[:index, layer, head]
    lowest = int(curve.argmin())
    return said + f"; that head's lowest before then is {_n(curve[lowest])} (at {_step(run.steps[lowest])})."


def icl_words(run: Run) -> str:
    """The in-context-learning score before and after the phase change (or at the first and last step), what it
    moved across it and after it."""
    rows, steps = run.rows, run.steps
    icl = run_series(rows, "icl")
    first, second, first_name, second_name = _before_after(run)
    a, b = icl[_index(rows, first)], icl[_index(rows, second)]
    late = f"tokens {tm.LATE[0]}-{tm.LATE[1] - 1}"
    early = f"tokens {tm.EARLY[0]}-{tm.EARLY[1] - 1}"
    said = (f"The **in-context-learning score** (the held-out loss on {late} of each window minus that on {early}; "
            f"negative: the later tokens, with more context before them, are predicted better) is "
            f"**{_signed(a)}** at {_step(first)}, {first_name}, and **{_signed(b)}** at {_step(second)}, "
            f"{second_name}: it moves by {_signed(b - a)}")
    if run.phase is not None:
        said += " across the phase change"
        if second != steps[-1]:
            said += (f", and by {_signed(icl[-1] - b)} from there to the last step ({_step(steps[-1])}: "
                     f"{_signed(icl[-1])})")
    return said + "."


def loss_words(run: Run) -> str:
    """The held-out loss at the first step, before and after the phase change and at the last step."""
    rows, steps = run.rows, run.steps
    loss = run_series(rows, "loss")
    first, second, first_name, second_name = _before_after(run)
    shown = [(steps[0], "the first measured step")] if first != steps[0] else []
    shown += [(first, first_name), (second, second_name)]
    if second != steps[-1]:
        shown.append((steps[-1], "the last"))
    each = ", ".join(f"{_nats(loss[_index(rows, step)])} at {_step(step)} ({name})" for step, name in shown)
    said = f"The **held-out loss** (nats per token): {each}."
    during = loss[_index(rows, first)] - loss[_index(rows, second)]
    if run.phase is None or not np.isfinite(during):
        return said
    whole = loss[0] - loss[-1]
    if abs(during) < 0.005:
        return said + " It barely moves across the phase change (by less than 0.005)."
    said += (f" It falls by {during:.2f}" if during > 0 else f" It rises by {-during:.2f}") + " across the phase change"
    if np.isfinite(whole) and 0 < during <= whole:
        said += f", {during / whole:.0%} of its fall over the whole run ({whole:.2f})"
    elif np.isfinite(whole) and during > whole:
        said += f", more than it falls over the whole run ({whole:.2f}): it rises again elsewhere"
    return said + "."


def previous_token_words(run: Run) -> str:
    """Which heads become previous-token heads (score over Explore heads' threshold) and when, against the phase
    change; or the highest score when none does."""
    scores = head_series(run.rows, "previous_token")  # [steps, layers, heads]
    if scores.size == 0:
        return "This run has no previous-token scores."
    formed = _formed_previous_token_heads(run)
    if not formed:
        layer, head = divmod(int(scores[-1].flatten().argmax()), scores.shape[2])
        return (f"No head is a **previous-token head** at the last step (a score of {format_number(PREVIOUS_TOKEN)} or "
                f"more, Explore heads' threshold): the highest then is **{head_label(layer, head)}**'s, "
                f"{_beside(scores[-1, layer, head], PREVIOUS_TOKEN)}.")
    steps, each = run.steps, []
    for step, layer, head, value, start, last in formed:
        if step == steps[0]:
            words = (f"**{head_label(layer, head)}** is at {format_number(PREVIOUS_TOKEN)} or over already at the "
                     f"first measured step ({_beside(value, PREVIOUS_TOKEN)} at {_step(step)}, {_n(last)} at the "
                     "last step)")
            each.append(words)
            continue
        words = (f"**{head_label(layer, head)}** reaches {format_number(PREVIOUS_TOKEN)} at {_step(step)} "
                 f"({_beside(value, PREVIOUS_TOKEN)}; {_n(start)} at {_step(steps[0])}, {_n(last)} at the last step)")
        if run.phase is not None:
            words += (f", before the phase change starts ({_step(run.phase.start)})" if step < run.phase.start else
                      f", after the phase change ends ({_step(run.phase.end)})" if step > run.phase.end else
                      ", during the phase change")
        each.append(words)
    heads = "One head is a" if len(formed) == 1 else f"{len(formed)} heads are"
    kind = "previous-token head" if len(formed) == 1 else "previous-token heads"
    return (f"{heads} **{kind}** at the last step (a previous-token score of {format_number(PREVIOUS_TOKEN)} or more, "
            f"Explore heads' threshold): " + "; ".join(each) + ".")


def ablation_words(run: Run) -> str:
    """What zeroing each induction head costs on the second copy, before and after the phase change (or at the first
    and the last step), beside the clean second copy's loss."""
    heads, followed = induction_heads(run), followed_heads(run)
    if not heads and not followed:
        return ""
    heads = heads or followed
    what = "an induction head" if not followed else "the head the phase change follows"
    rows, steps = run.rows, run.steps
    cost = head_series(rows, "ablation_cost")
    copy = run_series(rows, "copy_loss")
    first, second, first_name, second_name = _before_after(run)
    i, j = _index(rows, first), _index(rows, second)
    each = "; ".join(f"**{head_label(layer, head)}** {_signed(cost[i, layer, head])} → {_signed(cost[j, layer, head])}"
                     + (f" ({_signed(cost[-1, layer, head])} at the last step)" if second != steps[-1] else "")
                     for layer, head in heads)
    return (f"**Zeroing {what}** changes the loss on the second copy of repeated random tokens by, at "
            f"{_step(first)} ({first_name}) → {_step(second)} ({second_name}): {each}. The second copy's loss "
            f"with every head is {_nats(copy[i])} → {_nats(copy[j])} nats.")


def run_words(run: Run) -> list[str]:
    """The page's sentences about ``run``, in order (each a paragraph)."""
    said = [phase_words(run), induction_words(run), icl_words(run), loss_words(run), previous_token_words(run)]
    ablation = ablation_words(run)
    return said + ([ablation] if ablation else [])


def run_facts(run: Run) -> str:
    """How the run was measured: its steps, the checkpoints it keeps, and (when it says) how long it trained."""
    steps = run.steps
    said = (f"{len(steps):,} measured steps, from step {steps[0]:,} to step {steps[-1]:,}" if len(steps) > 1 else
            f"1 measured step, step {steps[0]:,}")
    kept = sorted(run.checkpoints)
    if kept:
        said += f"; checkpoints kept at step{'s' * (len(kept) > 1)} " + _listed([f"{step:,}" for step in kept])
    seconds, threads = run.facts.get("seconds"), run.facts.get("threads")
    if isinstance(seconds, (int, float)) and seconds > 0:
        took = "under 1 min" if seconds < 30 else f"{seconds / 60:,.0f} min"
        said += f"; its training steps took {took}" + (
            f" on {threads} CPU thread{'s' * (threads != 1)}" if isinstance(threads, int) else "")
    return said + "."


# -- one step -----------------------------------------------------------------------------------------------------
def default_step(run: Run) -> int:
    """The step the slider opens on: the end of the phase change, else the last measured step."""
    return run.phase.end if run.phase is not None else run.steps[-1]


def step_table(run: Run, step: int) -> pd.DataFrame:
    """Every head's measures at ``step``, a row per head."""
    row = run.rows[_index(run.rows, step)]
    layers, heads = np.asarray(row["induction"]).shape
    return pd.DataFrame([{"head": head_label(layer, head),
                          **{title: float(row[measure][layer][head]) for measure, title in HEAD_MEASURE_TITLES.items()}}
                         for layer in range(layers) for head in range(heads)])


@dataclass(frozen=True)
class StepNumbers:
    """The headline numbers of one step, for the metrics above its table."""

    loss: str
    icl: str
    copy_loss: str
    best_induction: str  # the highest induction score, with its head
    best_head: str


def step_numbers(run: Run, step: int) -> StepNumbers:
    row = run.rows[_index(run.rows, step)]
    scores = np.asarray(row["induction"], dtype=np.float64)
    layer, head = divmod(int(scores.argmax()), scores.shape[1])
    return StepNumbers(f"{row['loss']:.2f}", _signed(row["icl"]), f"{row['copy_loss']:.2f}", _n(scores[layer, head]),
                       head_label(layer, head))


def head_to_open(run: Run, step: int) -> tuple[int, int]:
    """The head Explore heads opens on: the first induction head the words name, else the head with the highest
    induction score at ``step``."""
    named = induction_heads(run) or followed_heads(run)
    if named:
        return named[0]
    steps = run.steps
    step = step if step in steps else min(steps, key=lambda measured: abs(measured - step))
    scores = np.asarray(run.rows[_index(run.rows, step)]["induction"], dtype=np.float64)
    layer, head = divmod(int(scores.argmax()), scores.shape[1])
    return layer, head


def checkpoint_name(run: Run, step: int) -> str:
    """The name a kept checkpoint is registered under in the session's models."""
    if run.name == BUNDLED_RUN_NAME:
        return f"tiny GPT at step {step:,} (bundled run)"
    return f"{run.name} at step {step:,}"


def opened_words(run: Run, step: int) -> str:
    """Which checkpoint the buttons open for the slider's ``step``: the nearest kept one, said when it is not
    ``step`` itself."""
    kept = sorted(run.checkpoints)
    if not kept:
        return "This run keeps no checkpoint to open."
    nearest = run.nearest_checkpoint(step)
    listed = ("steps " if len(kept) > 1 else "step ") + _listed([f"{s:,}" for s in kept])
    if nearest == step:
        return f"The buttons open the checkpoint kept at step {step:,} (this run keeps {listed})."
    return (f"This run keeps checkpoints at {listed} only: the buttons open **step {nearest:,}**, the nearest to step "
            f"{step:,} (on a log scale of steps).")
