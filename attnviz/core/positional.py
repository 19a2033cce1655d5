"""Positional encodings: sinusoidal (Vaswani et al.), RoPE (Su et al.) and ALiBi (Press et al.), with the
properties each one is known for, computed rather than asserted. A checkpoint's learned table is read by
:func:`attnviz.models.position_tables.learned_position_table`, which knows where each architecture keeps it."""

from __future__ import annotations

import math

import torch

from attnviz.core.attention import masked_softmax

# ---------------------------------------------------------------------------------------------------------------
# Sinusoidal: PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(pos / base^(2i/d))


def sinusoidal_frequencies(d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The ``d_model / 2`` angular frequencies ``1 / base^(2i / d_model)``, ``[d_model // 2]``."""
    if d_model < 2 or d_model % 2:
        raise ValueError(f"d_model must be an even number >= 2, got {d_model}")
    return base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)


def sinusoidal(n_positions: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The sinusoidal table, ``[n_positions, d_model]``, sin in even and cos in odd dimensions."""
    angles = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1) * sinusoidal_frequencies(d_model, base)
    table = torch.empty(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table


def sinusoidal_shift_matrix(k: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The matrix ``M_k`` with ``PE(pos + k) = M_k @ PE(pos)`` for every pos: a rotation of each (sin, cos) pair.

    [sin(a + b), cos(a + b)] = [[cos b, sin b], [-sin b, cos b]] @ [sin a, cos a], with b = k * frequency.
    """
    shift = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, frequency in enumerate(sinusoidal_frequencies(d_model, base).tolist()):
        b = k * frequency
        shift[2 * i, 2 * i], shift[2 * i, 2 * i + 1] = math.cos(b), math.sin(b)
        shift[2 * i + 1, 2 * i], shift[2 * i + 1, 2 * i + 1] = -math.sin(b), math.cos(b)
    return shift


def sinusoidal_layout(table: torch.Tensor, base: float = 10000.0, atol: float = 1e-2) -> str | None:
    """Whether ``table [n, d]`` holds the sinusoids of positions 0..n-1, and in which layout: "interleaved" (sin in
    even dimensions, cos in odd: Vaswani et al., :func:`sinusoidal`), "split" (the same sines in the first half of
    the dimensions, the cosines in the second: Marian's and Pegasus's code), or None (anything else: a trained
    table). ``atol`` allows a half-precision checkpoint's rounding."""
    n, d = table.shape
    if d < 2 or d % 2:
        return None
    reference = sinusoidal(n, d, base)
    table = table.double()
    if torch.allclose(table, reference, rtol=0, atol=atol):
        return "interleaved"
    split = torch.cat((reference[:, 0::2], reference[:, 1::2]), dim=1)
    return "split" if torch.allclose(table, split, rtol=0, atol=atol) else None


def dot_by_distance(table: torch.Tensor, origin: int = 0) -> torch.Tensor:
    """``table[origin] . table[origin + k]`` for k = 0 .. n - origin - 1, ``[n - origin]``."""
    return table[origin:] @ table[origin]


def cosine_by_distance(table: torch.Tensor, origin: int = 0) -> torch.Tensor:
    normed = table / table.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return dot_by_distance(normed, origin)


# ---------------------------------------------------------------------------------------------------------------
# RoPE: rotate each pair of query/key dimensions by an angle proportional to the position


def rope_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """``[head_dim // 2]`` frequencies ``base^(-2i / head_dim)``."""
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be an even number >= 2, got {head_dim}")
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE in the half-split layout of Llama and GPT-NeoX: dimension ``i`` pairs with ``i + d/2``.

    ``x [..., seq, head_dim]``, ``positions [seq]`` -> rotated ``x``, same shape.
    """
    frequencies = rope_frequencies(x.shape[-1], base).to(x.dtype)
    angles = positions.to(x.dtype).unsqueeze(-1) * frequencies  # [seq, head_dim / 2]
    angles = torch.cat((angles, angles), dim=-1)  # [seq, head_dim]
    return x * torch.cos(angles) + rotate_half(x) * torch.sin(angles)


def apply_rope_interleaved(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE as the paper writes it (Su et al.; GPT-J's code): dimension ``2i`` pairs with ``2i + 1``, rotated by
    ``position * base^(-2i / d)``. ``x [..., seq, head_dim]``, ``positions [seq]`` -> rotated ``x``."""
    frequencies = rope_frequencies(x.shape[-1], base).to(x.dtype)
    angles = positions.to(x.dtype).unsqueeze(-1) * frequencies  # [seq, head_dim / 2]
    cos, sin = torch.cos(angles), torch.sin(angles)
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)  # [..., seq, head_dim / 2] each
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def half_split_order(head_dim: int) -> torch.Tensor:
    """The dimension order that turns the paper's layout into the half-split one: pair ``(2i, 2i + 1)`` becomes
    ``(i, i + d/2)``. ``x_interleaved[..., order]`` is the same vector in the half-split layout."""
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def rope_layouts_gap(q: torch.Tensor, k: torch.Tensor, max_position: int, base: float = 10000.0) -> float:
    """The largest difference between the scores ``RoPE(q, m) . RoPE(k, n)`` of the two layouts, for the paper's
    ``q, k [head_dim]`` and the same vectors reordered into the half-split layout: the two are the same rotations
    of reordered dimensions, so the scores agree to rounding."""
    order = half_split_order(q.shape[-1])
    paper = rope_relative_scores_with(apply_rope_interleaved, q, k, max_position, base)
    half = rope_relative_scores(q[order], k[order], max_position, base)
    return (paper - half).abs().max().item()


def rope_relative_scores_with(rope, q: torch.Tensor, k: torch.Tensor, max_position: int,
                              base: float = 10000.0) -> torch.Tensor:
    """``score[m, n] = rope(q, m) . rope(k, n)`` with either layout's ``rope``, ``[max_position, max_position]``."""
    positions = torch.arange(max_position)
    return rope(q.expand(max_position, -1), positions, base) @ rope(k.expand(max_position, -1), positions, base).T


def rotate_pair(vector: tuple[float, float], angle: float) -> tuple[float, float]:
    x, y = vector
    return x * math.cos(angle) - y * math.sin(angle), x * math.sin(angle) + y * math.cos(angle)


def rope_relative_scores(q: torch.Tensor, k: torch.Tensor, max_position: int, base: float = 10000.0) -> torch.Tensor:
    """``score[m, n] = RoPE(q, m) . RoPE(k, n)`` for one fixed q and k, ``[max_position, max_position]``.

    Constant along diagonals (it depends on m - n only): the relative-position property."""
    return rope_relative_scores_with(apply_rope, q, k, max_position, base)


# ---------------------------------------------------------------------------------------------------------------
# ALiBi: no embeddings; a per-head linear penalty on distance added to the scores


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """The paper's slopes: a geometric sequence starting at 2^(-8/n), ratio 2^(-8/n), for n a power of two;
    otherwise the slopes of the closest smaller power of two, then every other slope of the next one."""
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two_slopes(n_heads), dtype=torch.float64)
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two_slopes(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_two_slopes(closest) + extra, dtype=torch.float64)


def alibi_bias(n_heads: int, n_q: int, n_k: int | None = None, *, causal: bool = True) -> torch.Tensor:
    """``[n_heads, n_q, n_k]`` additive bias ``-slope * distance`` (queries aligned to the end of the keys).

    Causal (the paper): distance = i - j for past keys (future keys are masked elsewhere, their bias is 0 here);
    bidirectional: distance = |i - j|."""
    n_k = n_q if n_k is None else n_k
    query_pos = torch.arange(n_q).unsqueeze(1) + (n_k - n_q)
    distance = (query_pos - torch.arange(n_k).unsqueeze(0)).to(torch.float64)  # [n_q, n_k]
    distance = distance.clamp_min(0) if causal else distance.abs()
    return -alibi_slopes(n_heads).view(-1, 1, 1) * distance


def permutation_of_words(n_tokens: int, seed: int, keep_ends: bool = True) -> list[int]:
    """A seeded shuffle of token positions; ``keep_ends`` keeps [CLS] first and [SEP] last in place."""
    generator = torch.Generator().manual_seed(int(seed))
    inner = list(range(1, n_tokens - 1)) if keep_ends and n_tokens > 2 else list(range(n_tokens))
    shuffled = [inner[i] for i in torch.randperm(len(inner), generator=generator).tolist()]
    return [0] + shuffled + [n_tokens - 1] if keep_ends and n_tokens > 2 else shuffled


def shift_error(table: torch.Tensor, shift: int, matrix: torch.Tensor) -> float:
    """max |PE(pos + k) - M_k PE(pos)| over the table: the shift property, checked."""
    return (table[shift:] - table[:-shift] @ matrix.T).abs().max().item()


def cosine_similarity_matrix(table: torch.Tensor) -> torch.Tensor:
    normed = table / table.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return normed @ normed.T


def random_pair(head_dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(int(seed))
    q, k = torch.randn(2, head_dim, generator=generator, dtype=torch.float64)
    return q, k


def toy_attention_with_and_without_rope(q: torch.Tensor, k: torch.Tensor, base: float = 10000.0):
    """Weights of a toy head ``q, k [n, d]`` without positions and with RoPE (positions 0..n-1)."""
    scale = 1 / math.sqrt(q.shape[-1])
    positions = torch.arange(q.shape[0])
    plain = masked_softmax(q @ k.T * scale)
    rotated = masked_softmax(apply_rope(q, positions, base) @ apply_rope(k, positions, base).T * scale)
    return plain, rotated
