"""The training loss of the tiny GPT: next-token cross-entropy fused with the LM head, a block of rows at a time.

On a CPU the LM head and its loss are about half of a training step: ``hidden @ W.T`` makes logits of
[tokens, vocabulary] (33 MB for 2,048 tokens and 4,096 tokens of vocabulary), and PyTorch's cross-entropy then reads
and writes that tensor several times (log-softmax, its gradient, a zeroed gradient, a copy). Here each block of rows
forms its logits, its losses and the softmax's gradient ``p - onehot(target)`` in one pass, and uses that gradient at
once for both products of the backward pass; nothing of the whole logits' size is kept. The arithmetic is the same as
``F.cross_entropy(hidden @ weight.T, targets).mean()`` (the tests compare losses and gradients); only the order of
the sums differs (docs/benchmarks.md: the step, 2026-12-07).
"""

from __future__ import annotations

import torch

ROWS_PER_BLOCK = 256  # [256 x 4,096] logits: 4 MB, in a core's cache's reach; 128 to 1,024 ran alike


class _MeanNextTokenLoss(torch.autograd.Function):
    """Forward: the mean loss and every row's loss. The gradients of the mean are formed in the forward pass (the
    softmax is at hand there), so the backward pass only scales them; the per-row losses take no gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, rows_per_block):
        # hidden [n, d_model], weight [vocab, d_model], targets [n]
        n = hidden.shape[0]
        losses = hidden.new_empty(n)  # [n]
        grad_hidden = torch.empty_like(hidden)  # [n, d_model]
        grad_weight = torch.zeros_like(weight)  # [vocab, d_model]
        for start in range(0, n, rows_per_block):
            rows = slice(start, start + rows_per_block)
            block, block_targets = hidden[rows], targets[rows]
            logits = block @ weight.T  # [block, vocab]
            target_logits = logits.gather(1, block_targets[:, None]).squeeze(1)  # [block]
            top = logits.amax(dim=-1, keepdim=True)  # [block, 1]
            exps = logits.sub_(top).exp_()  # in the logits' memory: one pass for the loss and the softmax
            sums = exps.sum(dim=-1, keepdim=True)  # [block, 1]
            losses[rows] = top.squeeze(1) + sums.log().squeeze(1) - target_logits
            probs = exps.div_(sums)  # softmax
            probs[torch.arange(len(block_targets)), block_targets] -= 1.0  # d loss_i / d logits_i
            grad_hidden[rows] = probs @ weight
            grad_weight.addmm_(probs.T, block)
        # the mean's 1/n
        grad_hidden /= n
        grad_weight /= n
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.mark_non_differentiable(losses)
        return losses.mean(), losses

    @staticmethod
    def backward(ctx, grad_mean, _grad_losses):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_mean, grad_weight * grad_mean, None, None


def mean_next_token_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         rows_per_block: int = ROWS_PER_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the logits ``hidden @ weight.T`` (an LM head without bias) against ``targets``.

    ``hidden`` [n, d_model] and ``weight`` [vocab, d_model], float32; ``targets`` [n] token ids, every one counted
    (no ``ignore_index``: an id outside the vocabulary raises). Returns the mean loss (differentiable in ``hidden``
    and ``weight``) and each row's loss [n] (detached)."""
    if hidden.ndim != 2 or targets.shape != hidden.shape[:1] or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"expected hidden [n, d], weight [vocab, d], targets [n]; got {tuple(hidden.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(targets.shape)}")
    if hidden.shape[0] < 1:
        raise ValueError("no rows: the mean of no losses is not defined")
    if hidden.dtype != torch.float32 or weight.dtype != torch.float32:
        raise ValueError(f"the fused loss sums in float32; got {hidden.dtype} and {weight.dtype}")
    if rows_per_block < 1:
        raise ValueError("rows_per_block must be at least 1")
    return _MeanNextTokenLoss.apply(hidden, weight, targets, rows_per_block)
