"""The Positional encodings page's work beyond the core: ALiBi's bias on a checkpoint's own scores, and the
numbers behind what the page says about a learned table, ALiBi's slopes and the toy RoPE head."""

from __future__ import annotations

import dataclasses
import math

import torch

from attnviz.core import positional
from attnviz.models import position_tables
from attnviz.models.capture import AttentionRecord


def alibi_on_real_head(record: AttentionRecord, layer: int, head: int, bias: torch.Tensor):
    """A real head's weights ``[n_q, n_k]`` as the model computes them (its scale, mask, position bias,
    soft-capping and sink: :meth:`AttentionRecord.layer_weights`), and the same with an ALiBi bias ``[n_q, n_k]``
    added to its scores."""
    return record.head_weights(layer, head), record.head_weights(layer, head, extra_bias=bias)


def model_alibi(record: AttentionRecord, layer: int, head: int) -> dict | None:
    """The model's own ALiBi, when the score bias it recorded is one (BLOOM): a bias that is the same for every
    query and linear in the key position, per head. Returns the slopes it implies ``[heads]`` (with the paper's
    for this many heads and whether they agree), the head's bias relative to each query's position ``[n_q, n_k]``
    (−m·distance), and the head's weights with and without the bias; None for any other bias (T5, MPNet) or none."""
    bias = record.biases[layer] if record.biases else None
    if bias is None or record.n_k < 2:
        return None
    # The model stored its bias in its own dtype (bf16 holds 3 significant digits): compare within that rounding
    relative_rounding = 4 * torch.finfo(bias.dtype).eps
    rounding = relative_rounding * float(bias.abs().max()) + 1e-6
    bias = bias.double()  # [heads, n_q, n_k]
    if (bias - bias[:, :1]).abs().max() > rounding:
        return None  # depends on the query: a relative bias, not ALiBi
    keys = torch.arange(record.n_k, dtype=torch.float64)
    slopes = ((bias[:, 0] - bias[:, 0, :1]) @ keys) / (keys @ keys)  # least squares: bias = m * key + c
    fitted = bias[:, 0, :1] + slopes[:, None] * keys  # [heads, n_k]
    if (fitted - bias[:, 0]).abs().max() > 2 * rounding:
        return None  # not linear in the key position
    standard = positional.alibi_slopes(record.n_heads)
    n_q, n_k = record.n_q, record.n_k
    query_position = torch.arange(n_q) + (n_k - n_q)
    relative = bias[head] - bias[head, :, query_position].diagonal()[:, None]  # [n_q, n_k]: m * (j - i)
    relative = relative.masked_fill(~record.mask_rows(layer), float("nan"))  # only where the model attends
    with_bias = record.head_weights(layer, head)
    without = dataclasses.replace(record, biases=[None] * record.n_layers, memo={}).head_weights(layer, head)
    return {"slopes": slopes, "standard": standard,
            "matches_paper": bool(torch.allclose(slopes, standard, rtol=max(1e-3, relative_rounding), atol=1e-7)),
            "bias": relative.float(), "with": with_bias, "without": without,
            "change": float((with_bias - without).abs().max())}


def learned_table_facts(table: torch.Tensor, shown: int) -> dict[str, float]:
    """What the learned tab claims, measured on ``table [positions, d_model]``'s first ``shown`` positions: the
    mean cosine similarity of neighbours and of positions far apart, and how much the similarity-by-distance
    curves from position 0 and from ``shown // 2`` disagree (0 for a purely relative table such as sinusoidal)."""
    part = table[:shown]
    similarity = positional.cosine_similarity_matrix(part)
    far = max(2, shown // 4)
    length = shown // 2
    first, second = (positional.cosine_by_distance(table, origin)[:length] for origin in (0, shown // 2))
    return {
        "near": float(similarity.diagonal(1).mean()),
        "far": float(torch.cat([similarity.diagonal(k) for k in range(far, shown)]).mean()),
        "far_from": far,
        "curves_gap": float((first - second).abs().max()),
    }


# The Learned tab: what it says about the current checkpoint's table, read from it (attnviz.models.architectures)

SINUSOID_LAYOUTS = {
    "interleaved": "sines in the even dimensions, cosines in the odd ones, as on the Sinusoidal tab",
    "split": "sines in the first half of the dimensions, cosines in the second (the Sinusoidal tab interleaves "
             "them)",
}


def no_table_text(model_name: str, model) -> str:
    """What the Learned tab says about a model without an absolute position table, and how it encodes positions."""
    return f"{model_name} has no absolute position table: {position_tables.position_scheme_text(model)}."


def table_caption(found: position_tables.PositionTable, model_name: str) -> str:
    """The Learned tab's line on the table: its size in positions (text) or rows (an image), trained or fixed, and
    which rows serve which positions or tokens."""
    d = found.rows.shape[1]
    made = "learned in training" if found.trained else "fixed sinusoidal, not trained"
    if found.is_image:
        return (f"`{found.name}` of {model_name}: {found.n_positions} rows x {d} dimensions, {made}, one row per "
                f"token the model makes of an image at its configured size: {found.rows_text()}.")
    text = f"`{found.name}` of {model_name}: {found.n_positions} positions x {d} dimensions, {made}."
    if found.first_row:
        last = found.first_row - 1
        unused, left = ("row 0 is", "it is") if last == 0 else (f"rows 0–{last} are", "they are")
        text += (f" The table holds {found.rows_in_checkpoint} rows; {unused} never a position ({found.skipped_because}"
                 f"), so {left} left out and the row labelled pos 0 is row {found.first_row}.")
    return text


def table_heatmap_caption(found: position_tables.PositionTable) -> str:
    """What made the table: training, or a formula (in the layout the table holds, checked on its values)."""
    clipped = ("Colours are clipped at the 99th percentile, as a few dimensions are much larger; hover for exact "
               "values.")
    if found.trained:
        return f"No formula made these: training did. {clipped}"
    layout = positional.sinusoidal_layout(found.rows)
    if layout is None:
        return f"Nothing here was trained: the model never updates this table. {clipped}"
    return (f"Nothing here was trained: row p is the sinusoid of position p, with {SINUSOID_LAYOUTS[layout]}. "
            f"{clipped}")


def table_band_caption(found: position_tables.PositionTable, facts: dict) -> str:
    """Whether nearby positions (an image's: consecutive rows) are alike, with the measured cosines."""
    near, far, far_from = facts["near"], facts["far"], facts["far_from"]
    unit = "rows" if found.is_image else "positions"
    neighbours = ("consecutive rows (each the next token in reading order)" if found.is_image
                  else "neighbouring positions")
    if near > far + 0.1:
        cause = "Training made" if found.trained else "The sinusoids make"
        return (f"A band along the diagonal: {neighbours} have cosine {near:.2f}, {unit} {far_from}+ apart "
                f"{far:.2f}. {cause} nearby {unit} alike.")
    untrained = " (as in an untrained model)" if found.trained else ""
    return (f"No band: {neighbours} have cosine {near:.2f}, {unit} {far_from}+ apart {far:.2f}. This table does not "
            f"make nearby {unit} alike{untrained}.")


def table_distance_caption(found: position_tables.PositionTable, facts: dict) -> str:
    """Whether the similarity by distance depends on the starting point, measured."""
    gap = facts["curves_gap"]
    if gap < 1e-3:
        return (f"The curves from two starting points coincide (largest gap {gap:.1e}): the similarity depends on "
                "the distance only, as for the sinusoidal table.")
    kind = "a learned table" if found.trained else "this table"
    return (f"The curves from two starting points differ by up to {gap:.2f} (the sinusoidal ones coincide): {kind} "
            "is only roughly relative.")


def model_table_series_name(found: position_tables.PositionTable, model_name: str) -> str:
    """The ALiBi tab's extrapolation chart: the model's own table, named as what it is."""
    kind = "learned" if found.trained else "fixed sinusoidal"
    return f"{model_name}'s {kind} table: cos(PE(0), PE(k))"


def extrapolation_caption(found: position_tables.PositionTable | None, model_name: str) -> str:
    if found is None:
        own = "A learned table simply ends (no vector exists past it)"
    elif found.trained:
        own = f"{model_name}'s learned table simply ends at position {found.n_positions - 1} (no vector exists past it)"
    else:
        own = (f"{model_name}'s table is fixed sinusoidal, yet it too ends at position {found.n_positions - 1}: its "
               "code computes only that many rows")
    return (f"Past the training length: {own}; sinusoidal vectors exist but were never seen in training; and "
            "ALiBi's penalty just keeps growing: why ALiBi extrapolated best in Press et al. (2022).")


def alibi_slopes_caption(n_heads: int) -> str:
    """How the paper's slopes are made for this many heads, with the numbers."""
    slopes = positional.alibi_slopes(n_heads).tolist()
    shown = ", ".join(f"1/{1 / s:.3g}" for s in slopes[:3]) + (f", …, 1/{1 / slopes[-1]:.3g}" if n_heads > 3 else "")
    if math.log2(n_heads).is_integer():
        rule = f"a geometric sequence starting at 2^(−8/{n_heads}) with that ratio"
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        rule = (f"not a power of two: the {closest} slopes of {closest} heads, then every other slope of "
                f"{2 * closest} heads")
    return f"For {n_heads} heads, {rule}: {shown}. Steep heads look locally, flat ones far."


def repeated_words(tokens: list[str]) -> list[str]:
    """Words that occur more than once (ignoring case), which share Q and K in the toy head."""
    seen, repeated = set(), []
    for token in tokens:
        lowered = token.lower()
        if lowered in seen and lowered not in repeated:
            repeated.append(lowered)
        seen.add(lowered)
    return repeated
