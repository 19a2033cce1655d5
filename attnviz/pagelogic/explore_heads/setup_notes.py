"""What Explore heads' setup area says about a text: the second text box's label for this architecture, where a
text too long for the model was cut, and the replay check (attnviz's weights times the model's V against the
model's own attention output) in words."""

from __future__ import annotations

import math

from attnviz.models.record import AttentionRecord, Capture
from attnviz.models.replay_check import ReplayDifference

AUTOMATIC_REPLAY_CELLS = 64 * 2048 * 2048  # above this (heads x N x N), the replay check waits for a click


def pair_field(architecture: str) -> tuple[str, str]:
    """The label and help of the second text box: an encoder-decoder's decoder input, else sentence B."""
    if architecture == "encoder-decoder":
        return ("Decoder input (empty: the sentence itself)",
                "What the decoder reads; its queries attend to the encoder's keys.")
    return "Second sentence (B), optional", "A sentence pair (A, B), as in BERT's training."


def truncation_note(capture: Capture, max_positions: int, max_tokens: int | None) -> str | None:
    """Where a text longer than the model reads (or than the eager path keeps) was cut; None when it was not, or
    when the reader asked for the first ``max_tokens`` tokens."""
    if not capture.truncated or (max_tokens is not None and len(capture.tokens) >= max_tokens):
        return None
    limit = (f"this model reads at most {max_positions}" if len(capture.tokens) >= max_positions
             else "on this model's eager path attnviz keeps every layer's weights at once, which fit up to "
                  f"{len(capture.tokens)}")
    return f"The text has {capture.length_of_text} tokens; {limit}. Showing the first {len(capture.tokens)}."


def replay_waits(record: AttentionRecord) -> bool:
    """Whether the replay check is too large to run on every rerun (it then waits for its button)."""
    return record.n_layers * record.n_heads * record.n_q * record.n_k > AUTOMATIC_REPLAY_CELLS


def replay_button_label(record: AttentionRecord) -> str:
    return f"Run the replay check ({record.n_layers} layers x {record.n_heads} heads x {record.n_q:,} tokens)"


def replay_verdict(difference: ReplayDifference, record: AttentionRecord) -> tuple[str, str]:
    """The replay check's result as ``(markdown, help)``: exact, within rounding, beyond it, or not finite."""
    if not math.isfinite(difference):
        return (":material/error: **Replay check: not finite.** The model's attention output, or attnviz's, holds "
                "NaN or infinity in at least one layer, so there is nothing to compare (see the warning above).",
                "The check compares attnviz's weights @ V with the model's own kernel, layer by layer; NaN never "
                "counts as agreement.")
    dtype = str(difference.dtype).removeprefix("torch.")
    rounding = (f"rounding in {dtype} allows each output an error of its own, from its weights, its values and the "
                f"size of its scores: the output nearest its bound differs by {difference.share:.0%} of it "
                f"({difference.allowed:.1e})")
    if not difference.passed:
        return (f":material/warning: **Replay check:** attnviz's own attention differs from the model's output by "
                f"up to **{difference:.1e}**, more than rounding in {dtype} explains.",
                f"attnviz's weights, times the model's V, should reproduce the attention output of the model's "
                f"kernel in every layer and head; {rounding}. What is shown here may not be what this model "
                "computes.")
    shown = "**exactly**" if difference == 0 else f"to within **{difference:.1e}**"
    return (f":material/check_circle: **Replay check:** attnviz's own attention reproduces the model's output in all "
            f"{record.n_layers} x {record.n_heads} heads {shown}.",
            f"The weights shown here are computed by attnviz's from-scratch attention from the model's own Q and "
            f"K; times its V, they reproduce the attention output of the model's kernel in every layer and head "
            f"(max difference {difference:.1e}; {rounding}).")
