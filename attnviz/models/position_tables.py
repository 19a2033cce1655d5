"""Positions: the absolute position table a checkpoint holds (trained, or fixed sinusoids), which of its rows serve
which positions, and how a model without one encodes positions; from the type's record in
:data:`attnviz.models.architectures.ARCHITECTURES`, or transformers' naming conventions for a type without one."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.models.architectures import ARCHITECTURES, Architecture


@dataclass(frozen=True)
class PositionTable:
    """A checkpoint's absolute position table as its model uses it: the rows that serve positions, the first
    position's row first, and what the record and the checkpoint say about them."""

    name: str  # the parameter, as ``model.named_parameters()`` names it
    rows: torch.Tensor  # [positions, d_model], float32, detached: only the rows that serve a position
    rows_in_checkpoint: int  # every row the parameter holds
    first_row: int  # the row that serves the first position (0; BART's offset 2; RoBERTa's padding_idx + 1)
    skipped_because: str  # why rows 0 .. first_row - 1 never serve a position ("" when there are none)
    trained: bool  # learned in training; False: fixed sinusoids the model's code computes (Marian, Pegasus)
    prefix: tuple[str, ...] | None = None  # a vision model: the tokens whose rows come before the patches' rows
    grid: tuple[int, int] | None = None  # a vision model: the (rows, cols) of patches the other rows serve

    @property
    def n_positions(self) -> int:
        return int(self.rows.shape[0])

    @property
    def is_image(self) -> bool:
        return self.prefix is not None

    def rows_text(self) -> str:
        """What the rows serve, in words: "rows 0–63 serve positions 0–63" for text; for an image "row 0 is [CLS],
        rows 1–16 the 4 x 4 patches in reading order (row by row)"."""
        n = self.n_positions
        if self.prefix is None:
            last = self.first_row + n - 1
            return f"rows {self.first_row}–{last} serve positions 0–{n - 1}"
        if self.grid is None:
            return f"{n} rows, one per token the model makes of an image"
        k = len(self.prefix)
        rows, cols = self.grid
        patches = f"the {rows} x {cols} patches in reading order (row by row)"
        if k == 0:
            return f"rows 0–{n - 1} are {patches}; no [CLS] or other token comes first"
        head = f"row 0 is {self.prefix[0]}" if k == 1 else f"rows 0–{k - 1} are {' and '.join(self.prefix)}"
        return f"{head}, rows {k}–{n - 1} {patches}"

    def labels(self) -> list[str]:
        """What each row serves: "pos 0", "pos 1", ... for text; for an image the prefix tokens ("[CLS]"), then
        "(row,col)" for each patch in reading order."""
        if self.prefix is None:
            return [f"pos {p}" for p in range(self.n_positions)]
        if self.grid is None:
            return [f"row {r}" for r in range(self.n_positions)]
        rows, cols = self.grid
        return list(self.prefix) + [f"({r},{c})" for r in range(rows) for c in range(cols)]


def position_table(model: torch.nn.Module) -> PositionTable | None:
    """The absolute position table of ``model`` (BERT, RoBERTa, GPT-2, BART, Marian, ViT, CLIP, ...), or None when
    it has none (RoPE, ALiBi, T5's relative bias; a config that leaves it out). Where it is and whether it is trained
    come from the type's record (DistilBERT's config may ask for sinusoids); which rows are positions from the record
    and the table's own module (its ``padding_idx``); a vision table's rows from the config's image and patch
    sizes. A type without a record: transformers' naming conventions, the module's ``offset`` and ``padding_idx``,
    and whether the parameter is trainable."""
    config = model.config
    record = ARCHITECTURES.get(getattr(config, "model_type", ""))
    found = _conventional_position_table(model) if record is None else _recorded_position_table(model, record)
    if found is None:
        return None
    name, parameter = found
    module = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    weight = parameter.detach().float()
    weight = weight[0] if weight.dim() == 3 else weight  # ViT-likes: [1, rows, d]
    first_row, because = _first_position_row(record, config, module)
    if record is None:
        trained = parameter.requires_grad and "sinusoidal" not in type(module).__name__.lower()
    else:
        fixed_by_config = record.sinusoidal_flag is not None and bool(getattr(config, record.sinusoidal_flag, False))
        trained = record.positions != "sinusoidal" and not fixed_by_config
    prefix, grid = (None, None)
    if record is not None and record.role == "vision":
        prefix, grid = _image_rows(config, record.image_prefix, weight.shape[0])
    return PositionTable(name, weight[first_row:], int(weight.shape[0]), first_row, because, trained, prefix, grid)


def learned_position_table(model: torch.nn.Module) -> tuple[str, torch.Tensor] | None:
    """``(parameter name, [positions, d_model])`` of :func:`position_table` (trained or fixed; the rows that serve
    positions, from position 0 on), or None."""
    found = position_table(model)
    return None if found is None else (found.name, found.rows)


def position_scheme_text(model: torch.nn.Module) -> str:
    """How ``model`` encodes positions when :func:`position_table` finds no table, in words for the pages: from its
    record and its config (Falcon's ``alibi`` flag)."""
    config = model.config
    record = ARCHITECTURES.get(getattr(config, "model_type", ""))
    if record is None:
        return "attnviz found no absolute position table in its weights"
    scheme = "ALiBi" if getattr(config, "alibi", False) is True else record.positions
    return {
        "rotary": "it rotates its queries and keys by their positions (RoPE)",
        "ALiBi": "it adds a per-head penalty, linear in the distance, to the scores (ALiBi)",
        "relative": "it adds relative-position terms to the scores",
        "learned + relative": "this configuration keeps only relative-position terms, without an absolute table",
    }.get(scheme, "this configuration has no absolute position table")


def _recorded_position_table(model: torch.nn.Module, record: Architecture):
    if record.position_table is None:
        return None
    for name, parameter in model.named_parameters():
        if name == record.position_table or name.endswith("." + record.position_table):
            if parameter.dim() == 2 or (parameter.dim() == 3 and parameter.shape[0] == 1):
                return name, parameter
    return None  # the config left it out (DeBERTa-v3: relative positions only)


def _first_position_row(record: Architecture | None, config, module: torch.nn.Module) -> tuple[int, str]:
    """The row that serves the first position, and why the rows before it never do."""
    padding = getattr(module, "padding_idx", None)
    if record is None:  # the module's own offset (BART-likes), else RoBERTa's rule when the table has a padding row
        offset = getattr(module, "offset", None)
        if isinstance(offset, int) and offset > 0:
            return offset, f"its code adds an offset of {offset} to every position id"
        return (0, "") if padding is None else (padding + 1, _padding_reason(padding))
    first, reasons = record.position_rows_skipped, []
    if first:
        reasons.append(f"its code adds an offset of {first} to every position id")
    if record.positions_after_padding:
        if padding is None:
            padding = int(getattr(config, "pad_token_id", None) or 0)
        first += padding + 1
        reasons.append(_padding_reason(padding))
    return first, "; ".join(reasons)


def _padding_reason(padding: int) -> str:
    unused = ("" if padding == 0 else " and row 0 is never used" if padding == 1
              else f" and rows 0–{padding - 1} are never used")
    return f"its position ids start at padding_idx + 1 = {padding + 1}: row {padding} is the padding row{unused}"


def _image_rows(config, names: tuple[str, ...], n_rows: int):
    """A vision table's prefix tokens and patch grid: the config's image and patch sizes give the grid; the rows
    before it are the record's prefix tokens when there are that many, else [CLS] and register tokens."""
    def pair(value):
        return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[-1]))

    try:
        (height, width), (patch_h, patch_w) = pair(config.image_size), pair(config.patch_size)
    except (AttributeError, TypeError, ValueError, IndexError):
        return (), None
    grid = (height // max(1, patch_h), width // max(1, patch_w))
    n_prefix = n_rows - grid[0] * grid[1]
    if n_prefix < 0:
        return (), None  # rows labelled by number
    if n_prefix == len(names):
        return tuple(names), grid
    if n_prefix == 0:
        return (), grid
    return ("[CLS]",) + tuple(f"[REG {i}]" for i in range(n_prefix - 1)), grid


def _conventional_position_table(model: torch.nn.Module):
    """A type without a record: the 2-D parameter named as transformers names position tables (the encoder's
    first)."""
    candidates = [name for name, parameter in model.named_parameters()
                  if parameter.dim() == 2 and _named_as_position_table(name.lower())]
    if not candidates:
        return None
    name = min(candidates, key=lambda candidate: ("decoder" in candidate, candidate))
    return name, model.get_parameter(name)


def _named_as_position_table(lowered: str) -> bool:
    return "position_embeddings" in lowered or lowered.endswith("wpe.weight") or "embed_positions" in lowered
