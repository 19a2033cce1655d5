"""Pre-norm against post-norm, as the "Over training" page shows it: the text the runs train on (the bundled tiny GPT's
own, through its own tokenizer), the runs' numbers in the shapes the figures take, the figures, and the words beside
them, each computed from the numbers shown (:mod:`attnviz.interventions.norm_placement` does the measuring).

Imports attnviz.interventions.norm_placement, attnviz.viz.norm_placement, attnviz.models and attnviz.tiny_gpt.text."""

from __future__ import annotations

import functools
import math
import statistics

import torch

from attnviz.interventions import norm_placement as npl
from attnviz.models.shipped import BUNDLED_GPT_DIR
from attnviz.models.text_tokenizers import tokenizer_of
from attnviz.tiny_gpt.text import HELD_OUT_SHARE, documentation_text, split_text
from attnviz.viz import norm_placement as figures
from attnviz.viz.style import format_number

SAME_NATS = 0.05  # two final held-out losses closer than this are called the same
LEVEL = 0.1  # a last-to-first gradient ratio within 10% of 1 is called level
FAR = 10  # a last-to-first ratio above this: the first blocks get little gradient, in the words
EARLY_STEPS = 50  # the words on the first steps' gradients read steps EARLY_STEPS // 2 + 1 .. EARLY_STEPS
SMOOTH = 10  # the training loss drawn as the mean of this many steps
TEXT_DESCRIBED = ("windows of Python's documentation (`pydoc_data.topics`, the first 90%; the held-out loss is "
                  "measured on the last 10%, which no run trains on), tokenized by the bundled tiny GPT's own "
                  "tokenizer: the documentation part of its training text (its recipe also trains on the standard "
                  "library's docstrings, which take 10-20 s to gather, and on repeated random tokens, which teach "
                  "copying around step 2,000, far beyond these runs)")


@functools.lru_cache(maxsize=1)
def bundled_text() -> npl.TrainingText:
    """The documentation split as the tiny GPT's recipe splits it, as token ids of its tokenizer (about a second,
    once per process)."""
    tokenizer = tokenizer_of(BUNDLED_GPT_DIR)
    train, held_out = split_text(documentation_text(), HELD_OUT_SHARE)
    return npl.TrainingText(torch.tensor(tokenizer(train)["input_ids"]),
                            torch.tensor(tokenizer(held_out)["input_ids"]), TEXT_DESCRIBED)


def ratio(values: list[float]) -> float:
    """The last layer's value over the first layer's (NaN when the first is 0)."""
    return values[-1] / values[0] if values and values[0] else float("nan")


def _times(value: float) -> str:
    """A ratio for reading: 3 significant digits, thousands with separators (15,300×, not 1.53e+04×)."""
    if math.isfinite(value) and abs(value) >= 1000:
        return f"{round(value, 2 - int(math.floor(math.log10(abs(value))))):,.0f}×"
    return f"{format_number(value)}×"


def trend(value: float) -> str:
    """A last-to-first ratio in words."""
    if value > 1 + LEVEL:
        return "grows towards the output"
    if value < 1 - LEVEL:
        return "falls towards the output"
    return f"is level, within {LEVEL:.0%}"


def settings_words(settings: npl.Settings) -> str:
    shape = settings.shape
    return (f"Both models have the tiny GPT's shape ({shape.n_layer} layers, {shape.n_head} heads, d_model "
            f"{shape.d_model}, MLP {shape.d_mlp}, vocabulary {shape.vocab_size:,}, learned positions, tied "
            "embeddings) and the same weights from seed "
            f"{settings.seed}: pre-norm has a final LayerNorm before the output; post-norm has none there (its last "
            "block ends in one) and normalises the embeddings instead, as BERT does, so the two have the same "
            f"parameters. Each run: {settings.steps} steps of {settings.batch} windows of {settings.length} tokens, "
            f"AdamW (betas 0.9, 0.95; weight decay {format_number(settings.weight_decay)} on matrices), the "
            f"gradient clipped to norm {format_number(settings.clip)}, peak learning rate "
            f"{format_number(settings.learning_rate)}, then a cosine decay to a tenth; the warm-up runs rise "
            f"linearly to the peak over their first {settings.warmup} steps. The same batches in every run.")


def init_words(gradients: dict[str, list[float]]) -> str:
    """What the gradient norms per block at initialisation show (``gradients``: norm -> ``[layers]``)."""
    pre, post = gradients["pre"], gradients["post"]
    r_pre, r_post = ratio(pre), ratio(post)
    said = "At initialisation, " + "; ".join(
        f"{npl.NORM_NAMES[norm]}'s gradient norm goes from {format_number(values[0])} at block 0 to "
        f"{format_number(values[-1])} at block {len(values) - 1} ({_times(ratio(values))}): it {trend(ratio(values))}"
        for norm, values in (("pre", pre), ("post", post))) + ". "
    said += (f"Post-norm's last-to-first ratio is {'higher than' if r_post > r_pre else 'not higher than'} "
             f"pre-norm's ({_times(r_post)} against {_times(r_pre)}). ")
    post_grows, pre_level = r_post > 1 + LEVEL, abs(r_pre - 1) <= LEVEL
    said += ("Xiong et al. (2020) found post-norm's gradients largest near the output at initialisation and "
             "pre-norm's level across layers: ")
    if post_grows and pre_level:
        said += "this model shows the same."
    elif post_grows:
        said += f"this model's post-norm shows the first, but its pre-norm's {trend(r_pre)}."
    else:
        said += f"this model does not show that at initialisation (its post-norm's {trend(r_post)})."
    scale = [p / q for p, q in zip(pre, post, strict=True) if q]
    if scale:
        said += (f" Block by block, pre-norm's gradients are {_times(min(scale))} to {_times(max(scale))} "
                 "post-norm's.")
    return said


def early_ratios(run: npl.Run, upto: int = EARLY_STEPS) -> tuple[float, int, int] | None:
    """The median last-to-first gradient ratio of ``run`` over steps ``upto // 2 + 1 .. upto`` (fewer when it has
    fewer), and those steps; None when it has no step after 0."""
    last = min(upto, len(run.grad_norms) - 1)
    if last < 1:
        return None
    first = last // 2 + 1
    return statistics.median(ratio(run.grad_norms[step]) for step in range(first, last + 1)), first, last


def early_words(result: npl.Result, upto: int = EARLY_STEPS) -> str:
    """The first steps' gradients: each run's median last-to-first ratio over its early steps."""
    found = [(run, early_ratios(run, upto)) for run in result.runs]
    found = [(run, ratios) for run, ratios in found if ratios is not None]
    if not found:
        return "The runs have no step after the first: nothing to say about the first steps."
    first, last = found[0][1][1:]
    parts = [f"{run.name} {_times(ratios[0])}" for run, ratios in found]
    said = (f"Over steps {first}-{last}, the last block's gradient norm is, in the median step, this many times the "
            f"first block's: " + "; ".join(parts) + ".")
    post = [ratios[0] for run, ratios in found if run.norm == "post"]
    pre = [ratios[0] for run, ratios in found if run.norm == "pre"]
    if not (post and pre):
        return said
    if min(post) <= max(pre):
        return said + " Post-norm's gradients are not more concentrated near the output than pre-norm's in every run."
    said += (" In both post-norm runs the gradients are more concentrated near the output than in either pre-norm "
             "run")
    if min(post) <= FAR:
        return said + "."
    run = result.run("post", False)
    _, first, last = early_ratios(run, upto)
    block_0 = statistics.median(run.grad_norms[step][0] for step in range(first, last + 1))
    return said + (f", the last block getting more than {FAR:g}× the first's: the first blocks of post-norm get "
                   f"little gradient once training starts (without warm-up, block 0's is "
                   f"{format_number(run.grad_norms[0][0])} at step 0, a median {format_number(block_0)} over steps "
                   f"{first}-{last}).")


def _final(run: npl.Run) -> str:
    if run.diverged_at is not None:
        return f"diverged at step {run.diverged_at} (its loss was no longer finite)"
    return f"{format_number(run.final_held_out)}"


def loss_words(result: npl.Result) -> str:
    """How the four runs end, and how post-norm without warm-up compares with pre-norm without warm-up."""
    ends = "; ".join(f"{run.name}: {_final(run)}" for run in result.runs)
    said = f"Held-out loss at the end (nats per token; {format_number(result.runs[0].held_out[0])} at step 0): {ends}."
    pre, post = result.run("pre", False), result.run("post", False)
    if post.diverged_at is not None:
        said += (f" Without warm-up, post-norm diverged at step {post.diverged_at}"
                 + (" and pre-norm did not." if pre.diverged_at is None else
                    f"; so did pre-norm, at step {pre.diverged_at}."))
        return said
    said += " Without warm-up, post-norm did not diverge at this learning rate"
    if pre.diverged_at is not None:
        return said + f", but pre-norm did (step {pre.diverged_at})."
    difference = post.final_held_out - pre.final_held_out
    if difference > SAME_NATS:
        said += f"; it ends worse than pre-norm, by {format_number(difference)} nats."
    elif difference < -SAME_NATS:
        said += f"; it ends better than pre-norm, by {format_number(-difference)} nats."
    else:
        said += f"; it ends where pre-norm does (within {SAME_NATS} nats: {format_number(difference)})."
    return said


def warmup_words(result: npl.Result) -> str:
    """What warm-up changes for each placement: its final held-out loss with and without."""
    parts = []
    for norm in npl.NORMS:
        without, warmed = result.run(norm, False), result.run(norm, True)
        name = npl.NORM_NAMES[norm].capitalize()
        if without.diverged_at is not None or warmed.diverged_at is not None:
            parts.append(f"{name}: without warm-up {_final(without)}, with it {_final(warmed)}.")
            continue
        change = warmed.final_held_out - without.final_held_out
        how = (f"lowers its final held-out loss by {format_number(-change)} nats" if change < -SAME_NATS else
               f"raises its final held-out loss by {format_number(change)} nats" if change > SAME_NATS else
               f"changes its final held-out loss by less than {SAME_NATS} nats")
        parts.append(f"{name}: warm-up {how} ({format_number(without.final_held_out)} → "
                     f"{format_number(warmed.final_held_out)}).")
    settings = result.settings
    return f"Warm-up ({settings.warmup} of the {settings.steps} steps). " + " ".join(parts)


def loss_runs(result: npl.Result) -> dict[str, dict]:
    """The runs as :func:`attnviz.viz.norm_placement.loss_curves_figure` takes them."""
    return {run.name: {"norm": run.norm, "warmup": run.warmup, "losses": run.losses, "held_out": run.held_out}
            for run in result.runs}


def init_figure(gradients: dict[str, list[float]]):
    """The gradient norm per block at initialisation, with its caption."""
    caption = (f"One backward pass each, on the runs' first batch. Log scale: equal slopes are equal ratios; the last "
               f"block's gradient is {_times(ratio(gradients['post']))} the first's with post-norm, "
               f"{_times(ratio(gradients['pre']))} with pre-norm.")
    return figures.init_gradient_figure(gradients, npl.NORM_NAMES), caption


def gradients_figure(result: npl.Result):
    """Each block's gradient norm over the four runs' steps, with its caption."""
    figure = figures.gradients_over_steps_figure({run.name: run.grad_norms for run in result.runs})
    found = [(run, early_ratios(run)) for run in result.runs]
    named = [f"{run.name} {_times(ratios[0])}" for run, ratios in found if ratios is not None]
    caption = ("Before clipping, one line per block (darkest: block 0), every panel on the same log scale. "
               + (f"Median last-to-first ratio, steps {found[0][1][1]}-{found[0][1][2]}: " + "; ".join(named) + "."
                  if named else ""))
    return figure, caption


def losses_figure(result: npl.Result):
    """The four runs' loss curves, with their caption."""
    figure = figures.loss_curves_figure(loss_runs(result), smooth=SMOOTH)
    best = min((run for run in result.runs if run.diverged_at is None), key=lambda run: run.final_held_out,
               default=None)
    caption = (f"Held-out loss (markers) and the training loss, the mean of the last {SMOOTH} steps (faint); blue "
               "pre-norm, red post-norm, dashed with warm-up. "
               + (f"Lowest at the end: {best.name} ({format_number(best.final_held_out)})." if best else
                  "Every run diverged."))
    return figure, caption


def timing_words(result: npl.Result) -> str:
    runs = ", ".join(f"{run.seconds:.0f} s" for run in result.runs)
    return (f"The four runs took {result.seconds:.0f} s on {result.threads} CPU thread"
            f"{'s' if result.threads != 1 else ''} ({runs}). They trained on {result.text}.")
