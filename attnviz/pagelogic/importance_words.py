"""What the "Does this head matter?" page says beside its numbers, by objective: how the texts were read (a BOS token
or not), what a head's per-token view measures, and how its bars add up to the map's cell. Pure functions of the
numbers shown."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.interventions.importance import ImportanceMap
from attnviz.interventions.patching import start_words
from attnviz.viz.style import format_number


@dataclass(frozen=True)
class TokenView:
    """The per-token view's words for one objective."""

    heading: str
    axis: str  # the tokens' axis
    measure: str  # a bar's unit
    caption: str  # under the bars
    empty: str  # said when the text has no bar


TOKEN_VIEWS = {
    "hidden": TokenView(
        "How far does a head move each token's final state?", "token", "hidden-state change",
        "Each bar: how far that token's final hidden state moves without the head, over the mean size of this "
        "text's unedited final states (a distance: never negative). No loss is measured: the model has none.",
        "This text has no token to measure. Choose another text."),
    "masked": TokenView(
        "Which tokens does a head help predict?", "masked token", "loss change (nats)",
        "Each bar: how the masked-LM loss of predicting that token (masked in one of the text's copies) moves "
        "without the head (red: the head helped).",
        "This text has no ordinary token to mask. Choose another text."),
}
DEFAULT_VIEW = TokenView(
    "Which tokens does a head help predict?", "predicted token", "loss change (nats)",
    "Each bar: how the loss of predicting that token moves without the head (red: the head helped).",
    "This text has no token to predict (one token: nothing follows it). Choose another text.")


def token_view(objective: str) -> TokenView:
    return TOKEN_VIEWS.get(objective, DEFAULT_VIEW)


def token_summary(change: torch.Tensor, one_map: ImportanceMap, row: int, head: int, text: int, unit: str) -> str:
    """How the bars add up: their mean is the text's value, and the map's cell is the mean of the texts' values.
    Said from the numbers: the bars' own mean, the text's value in the map, the cell."""
    mean = float(change.double().mean())
    texts = int((~one_map.per_text[row, head].isnan()).sum()) if one_map.per_text is not None else 1
    cell = float(one_map.values[row, head])
    said = f"The mean of these {len(change)} bars is **{format_number(mean)}**{' ' + unit if unit else ''}"
    if texts <= 1:
        return said + f": the map's cell for this head ({format_number(cell)})."
    value = float(one_map.per_text[row, head, text])
    return (said + f", this text's value (the map keeps {format_number(value)} for it); the map's cell, "
            f"**{format_number(cell)}**, is the mean of the {texts} texts' values.")


def reading_words(tokenizer, objective: str) -> str:
    """How the texts were read (as :func:`attnviz.interventions.importance.batch_of` reads them: the tokenizer's own
    ids),
    in words: whether they start with a BOS (or another special) token, and what that means for the first token's
    loss."""
    ids = tokenizer("a")["input_ids"]
    said = f"Each text is read as the tokenizer gives it: it {start_words(tokenizer, ids)}"
    if objective == "next-token":
        first_special = bool(ids) and ids[0] in set(tokenizer.all_special_ids)
        said += ("; the first token after it is predicted from it, and counted" if first_special else
                 "; nothing predicts a text's first token, so it is not counted")
    return said + "."


def mlp_words(found: dict, maps: dict[str, ImportanceMap]) -> str:
    """The costliest MLP beside the costliest head, for each ablation measured (``found``: ``MlpAblation`` by "zero"
    or "mean"), in words computed from both maps."""
    said = []
    for how, mlps in found.items():
        heads = maps[how].values  # [modules, heads]
        hidden = maps[how].objective == "hidden"
        layer = int(mlps.values.argmax())
        flat = int(heads.nan_to_num(float("-inf")).flatten().argmax())
        row, head = divmod(flat, heads.shape[1])
        mlp_value, head_value = float(mlps.values[layer]), float(heads[row, head])

        def effect(value: float, hidden: bool = hidden) -> str:
            if hidden:
                return f"moves the final states by {format_number(value)}"
            return f"{'raises' if value >= 0 else 'lowers'} the loss by {format_number(abs(value))} nats"

        compared = "more than" if mlp_value > head_value else "less than" if mlp_value < head_value else "as much as"
        said.append(f"{how.capitalize()} ablation: removing {mlps.labels[layer]}'s MLP {effect(mlp_value)}, the most "
                    f"of any MLP and {compared} the costliest head ({maps[how].modules[row].label} head {head}: "
                    f"{effect(head_value)}).")
    return " ".join(said)
