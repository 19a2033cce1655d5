"""Why attention divides by sqrt(d_k): the variance of dot products, softmax saturation and its vanishing
gradient, and the max-subtraction trick that keeps softmax finite."""

from __future__ import annotations

import math

import torch

D_K_VALUES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def dot_samples(d_k: int, n_samples: int, seed: int = 0) -> torch.Tensor:
    """``q . k`` for ``n_samples`` pairs of vectors with independent unit-variance entries: Var = d_k."""
    generator = torch.Generator().manual_seed(int(seed))
    q = torch.randn(n_samples, d_k, generator=generator, dtype=torch.float64)
    k = torch.randn(n_samples, d_k, generator=generator, dtype=torch.float64)
    return (q * k).sum(-1)


def dot_product_variance(d_values: list[int], n_samples: int = 4000, seed: int = 0) -> list[dict]:
    """Measured variance of q . k (and of q . k / sqrt(d_k)) against the theory Var = d_k (and 1)."""
    rows = []
    for d_k in d_values:
        samples = dot_samples(d_k, n_samples, seed)
        rows.append(
            {
                "d_k": d_k,
                "measured": samples.var().item(),
                "theory": float(d_k),
                "measured_scaled": (samples / math.sqrt(d_k)).var().item(),
            }
        )
    return rows


def jacobian_norm(weights: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of the softmax Jacobian ``diag(p) - p p^T`` for each row ``p`` of ``[..., n]``."""
    jacobian = torch.diag_embed(weights) - weights.unsqueeze(-1) * weights.unsqueeze(-2)  # [..., n, n]
    return jacobian.flatten(-2).norm(dim=-1)


def entropy(weights: torch.Tensor) -> torch.Tensor:
    logs = torch.where(weights > 0, weights.clamp_min(1e-300).log(), torch.zeros_like(weights))
    return -(weights * logs).sum(-1)


def random_scores(d_k: int, n_keys: int, n_rows: int, seed: int) -> torch.Tensor:
    """Unscaled scores q . k of random queries against ``n_keys`` random keys, ``[n_rows, n_keys]``."""
    generator = torch.Generator().manual_seed(int(seed))
    q = torch.randn(n_rows, 1, d_k, generator=generator, dtype=torch.float64)
    k = torch.randn(n_rows, n_keys, d_k, generator=generator, dtype=torch.float64)
    return (q * k).sum(-1)  # [n_rows, n_keys]


def softmax_rows(d_k: int, n_keys: int, n_rows: int, seed: int, scaled: bool) -> torch.Tensor:
    """Softmax rows of random q against ``n_keys`` random keys, ``[n_rows, n_keys]``."""
    scores = random_scores(d_k, n_keys, n_rows, seed)
    return torch.softmax(scores / math.sqrt(d_k) if scaled else scores, dim=-1)


QUERIES_PER_POINT = 64  # rows averaged for each point of the saturation curves


def softmax_statistics(
    d_values: list[int], n_keys: int = 64, n_rows: int = QUERIES_PER_POINT, seed: int = 0
) -> list[dict]:
    """Entropy, max weight and Jacobian norm of the softmax, with and without scaling, for each d_k."""
    rows = []
    for d_k in d_values:
        row = {"d_k": d_k}
        scores = random_scores(d_k, n_keys, n_rows, seed)  # the same draws for both: only the scaling differs
        for name, scaled in (("scaled", True), ("unscaled", False)):
            weights = torch.softmax(scores / math.sqrt(d_k) if scaled else scores, dim=-1)
            row[f"entropy_{name}"] = entropy(weights).mean().item()
            row[f"max_weight_{name}"] = weights.amax(-1).mean().item()
            row[f"jacobian_{name}"] = jacobian_norm(weights).mean().item()
        rows.append(row)
    return rows


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    """exp(x) / sum(exp(x)) computed as written: overflows for large logits."""
    exponentials = torch.exp(x)
    return exponentials / exponentials.sum(-1, keepdim=True)


def stable_softmax(x: torch.Tensor) -> torch.Tensor:
    """The same function, computed as exp(x - max) / sum(exp(x - max)): every exponent is <= 0."""
    exponentials = torch.exp(x - x.amax(-1, keepdim=True))
    return exponentials / exponentials.sum(-1, keepdim=True)


def exp_overflow_threshold(dtype: torch.dtype) -> float:
    """The largest x whose e^x is finite in ``dtype``: log of its largest number (fp16 11.09, fp32 88.72)."""
    return math.log(torch.finfo(dtype).max)


WRONG_BY = 1e-2  # a softmax off by more than this from fp64 is wrong, even if finite


def stability_table(logit_scales: list[float], dtypes: dict[str, torch.dtype], seed: int = 0) -> list[dict]:
    """Naive vs max-subtracted softmax on 8 logits of growing size, per dtype: finite? error vs fp64? right?

    The logits are seeded random numbers stretched to ``[-scale, scale]``, so the largest is exactly ``scale``;
    the "max logit" column reports the largest logit as it is in that dtype.
    """
    generator = torch.Generator().manual_seed(int(seed))
    base = torch.randn(8, generator=generator, dtype=torch.float64)
    base = (base - base.min()) / (base.max() - base.min()) * 2 - 1  # in [-1, 1], the largest exactly 1
    rows = []
    for scale in logit_scales:
        logits = base * scale
        reference = torch.softmax(logits, dim=-1)
        for name, dtype in dtypes.items():
            x = logits.to(dtype)
            for method, function in (("naive", naive_softmax), ("max-subtracted", stable_softmax)):
                result = function(x).double()
                finite = bool(torch.isfinite(result).all())
                error = (result - reference).abs().max().item() if finite else float("nan")
                rows.append(
                    {
                        "max logit": float(x.max()),
                        "dtype": name,
                        "method": method,
                        "finite": finite,
                        "max |error| vs fp64": error,
                        "right": finite and error <= WRONG_BY,
                        "output": ", ".join(f"{v:.3g}" for v in result[:4].tolist()) + ", …" if finite else "NaN/inf",
                    }
                )
    return rows
