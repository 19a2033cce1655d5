"""Pre-norm against post-norm, measured: the bundled tiny GPT's shape built both ways, its gradients per layer at
initialisation and over the first steps, and four short training runs (each way, with and without learning-rate
warm-up). Xiong et al. 2020 ("On Layer Normalization in the Transformer Architecture") show that with post-norm the
gradients of the parameters near the output are large at initialisation, which is why post-norm needs warm-up, and
that pre-norm's stay level across layers; here the same is measured on a small model, whatever it shows.

- pre-norm (GPT-2): ``x + attn(LN(x))``, then ``x + mlp(LN(x))``, and a final LayerNorm before the LM head;
- post-norm (the original Transformer, BERT): ``LN(x + attn(x))``, then ``LN(x + mlp(x))``. Its last block already
  ends in a LayerNorm, so it has no final one; it normalises the embeddings instead, as BERT does, so that both
  models have exactly the same parameters (the same count, the same shapes) and, from one seed, the same weights.

Everything else is the tiny GPT's (:mod:`attnviz.tiny_gpt.train`): learned positions, tied embeddings, GELU (tanh,
GPT-2's ``gelu_new``), GPT-2's initialisation (normal, std 0.02; the two output projections of each block std
0.02 / sqrt(2 x layers)), AdamW with betas (0.9, 0.95) and weight decay on matrices only, the gradient clipped to
norm 1, a linear warm-up then a cosine decay to a tenth. The data are windows of the tiny GPT's training text; the
caller passes the token ids (:class:`TrainingText`), so this module needs no tokenizer.

Deterministic given the seed (and the number of CPU threads, which can change the rounding): the four runs start
from the same weights and see the same batches.

Imports torch and attnviz.core (attention, masks)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from attnviz.core import masks
from attnviz.core.attention import scaled_dot_product_attention
from attnviz.core.schedule import log_spaced_steps, warmup_cosine

NORMS = ("pre", "post")
NORM_NAMES = {"pre": "pre-norm", "post": "post-norm"}


@dataclass(frozen=True)
class Shape:
    """The decoder's shape; the defaults are the bundled tiny GPT's (its Recipe and config.json)."""

    vocab_size: int = 4096
    context: int = 256
    n_layer: int = 3
    n_head: int = 4
    d_model: int = 128
    d_mlp: int = 384
    layer_norm_eps: float = 1e-5
    gelu: str = "tanh"  # GPT-2's gelu_new; "none": the exact GELU (torch.nn.TransformerEncoderLayer's "gelu")
    init_std: float = 0.02


class SelfAttention(nn.Module):
    """Causal multi-head self-attention, Q, K and V from one projection (GPT-2's ``c_attn``)."""

    def __init__(self, shape: Shape):
        super().__init__()
        self.n_head = shape.n_head
        self.qkv = nn.Linear(shape.d_model, 3 * shape.d_model)
        self.proj = nn.Linear(shape.d_model, shape.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape  # [batch, seq, d_model]
        q, k, v = (part.view(batch, seq, self.n_head, d_model // self.n_head).transpose(1, 2)
                   for part in self.qkv(x).split(d_model, dim=-1))  # each [batch, heads, seq, head_dim]
        heads, _ = scaled_dot_product_attention(q, k, v, masks.causal(seq).to(x.device))  # [batch, heads, seq, hd]
        return self.proj(heads.transpose(1, 2).reshape(batch, seq, d_model))  # [batch, seq, d_model]


class MLP(nn.Module):
    def __init__(self, shape: Shape):
        super().__init__()
        self.fc = nn.Linear(shape.d_model, shape.d_mlp)
        self.proj = nn.Linear(shape.d_mlp, shape.d_model)
        self.gelu = shape.gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate=self.gelu))  # [batch, seq, d_model]


class Block(nn.Module):
    """One transformer block; ``norm`` says where its two LayerNorms sit."""

    def __init__(self, shape: Shape, norm: str):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm must be 'pre' or 'post', got {norm!r}")
        self.norm = norm
        self.ln_1 = nn.LayerNorm(shape.d_model, eps=shape.layer_norm_eps)
        self.attn = SelfAttention(shape)
        self.ln_2 = nn.LayerNorm(shape.d_model, eps=shape.layer_norm_eps)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, seq, d_model] -> the same
        if self.norm == "pre":  # GPT-2: the residual stream itself is never normalised
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + self.attn(x))  # the original Transformer, BERT: every sub-layer's sum is normalised
        return self.ln_2(x + self.mlp(x))


class Decoder(nn.Module):
    """A GPT: token and learned position embeddings, ``n_layer`` blocks, an LM head tied to the token embeddings.

    Pre-norm: a final LayerNorm (``ln_f``) before the head. Post-norm: none there (the last block ends in one); a
    LayerNorm on the embeddings instead (``ln_embed``, as BERT), so both have the same parameter count. The weights
    are drawn from ``seed`` (GPT-2's initialisation): the same seed gives both norms the same weights."""

    def __init__(self, shape: Shape = Shape(), norm: str = "pre", seed: int = 0):
        super().__init__()
        self.shape, self.norm = shape, norm
        self.wte = nn.Embedding(shape.vocab_size, shape.d_model)
        self.wpe = nn.Embedding(shape.context, shape.d_model)
        self.blocks = nn.ModuleList(Block(shape, norm) for _ in range(shape.n_layer))
        if norm == "pre":
            self.ln_f = nn.LayerNorm(shape.d_model, eps=shape.layer_norm_eps)
        else:
            self.ln_embed = nn.LayerNorm(shape.d_model, eps=shape.layer_norm_eps)
        initialise(self, seed)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids ``[batch, seq]`` -> next-token logits ``[batch, seq, vocab]``."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(positions)  # [batch, seq, d_model]
        if self.norm == "post":
            x = self.ln_embed(x)
        for block in self.blocks:
            x = block(x)
        if self.norm == "pre":
            x = self.ln_f(x)
        return x @ self.wte.weight.T  # [batch, seq, vocab]: tied embeddings

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        """The mean next-token cross-entropy over the batch ``[batch, seq]`` (nats per token)."""
        logits = self(ids)  # [batch, seq, vocab]
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@torch.no_grad()
def initialise(model: Decoder, seed: int) -> None:
    """GPT-2's initialisation (transformers' ``GPT2PreTrainedModel._init_weights``), drawn from its own generator:
    every matrix normal with std 0.02, the blocks' two output projections std 0.02 / sqrt(2 x layers) (the
    residual stream adds 2 of them per layer), biases 0, LayerNorms 1 and 0. The LayerNorms draw nothing, so the
    pre- and the post-norm model of one seed have the same weights."""
    generator = torch.Generator().manual_seed(seed)
    std = model.shape.init_std
    for name, parameter in model.named_parameters():
        if parameter.ndim == 2:
            scale = std / math.sqrt(2 * model.shape.n_layer) if name.endswith("proj.weight") else std
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
        elif name.split(".")[-2].startswith("ln") and name.endswith("weight"):
            parameter.fill_(1.0)
        else:
            parameter.zero_()


def block_gradient_norms(model: Decoder) -> list[float]:
    """Each block's gradient norm ``[layers]``: the 2-norm of all its parameters' ``.grad`` together (attention,
    MLP and both LayerNorms), as they are now (before any clipping)."""
    norms = []
    for block in model.blocks:
        each = [torch.linalg.vector_norm(p.grad) for p in block.parameters() if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack(each))) if each else 0.0)  # sqrt of the sum of squares
    return norms


def gradient_norms(model: Decoder, batch: torch.Tensor) -> list[float]:
    """One backward pass of the next-token loss on ``batch`` ``[batch, seq]``: each block's gradient norm
    ``[layers]`` (its gradients are left in the model's ``.grad``)."""
    model.zero_grad(set_to_none=True)
    model.loss(batch).backward()
    return block_gradient_norms(model)


@dataclass(frozen=True)
class Settings:
    """An experiment: four runs of ``steps`` steps (pre- and post-norm, each without warm-up and with ``warmup``
    warm-up steps) at peak ``learning_rate``, on ``batch`` windows of ``length`` tokens a step."""

    learning_rate: float = 1e-2  # 5x the tiny GPT's recipe (2e-3): Xiong et al.'s case, large and no warm-up
    steps: int = 200
    warmup: int = 50  # the warm-up runs' steps of linear warm-up (the others start at the peak)
    seed: int = 0
    batch: int = 8
    length: int = 64
    weight_decay: float = 0.1  # the tiny GPT's recipe
    clip: float = 1.0  # the tiny GPT's recipe: the whole gradient clipped to this norm
    held_out_windows: int = 16  # windows of ``length`` tokens, spread evenly over the held-out text
    held_out_points: int = 16  # held-out loss measured at this many steps, spaced evenly on a log scale
    shape: Shape = Shape()

    def warmups(self) -> tuple[int, int]:
        return (0, self.warmup)


@dataclass(frozen=True)
class TrainingText:
    """Token ids to train on and to measure on (never trained on), and what they are, in words."""

    train_ids: torch.Tensor  # [tokens]
    held_out_ids: torch.Tensor  # [tokens]
    described: str = ""


def training_batches(train_ids: torch.Tensor, batch: int, length: int, generator: torch.Generator):
    """Endless ``[batch, length]`` windows of ``train_ids`` at random starts: the documentation rows of
    :func:`attnviz.tiny_gpt.train.batches` (the same draws from the same generator)."""
    while True:
        starts = torch.randint(0, len(train_ids) - length, (batch,), generator=generator)
        yield torch.stack([train_ids[s : s + length] for s in starts.tolist()])  # [batch, length]


def held_out_windows(held_out_ids: torch.Tensor, windows: int, length: int) -> torch.Tensor:
    """``[windows, length]`` windows spread evenly over the held-out ids (as the tiny GPT's held-out loss)."""
    if len(held_out_ids) < length + 1:
        raise ValueError(f"the held-out text has {len(held_out_ids)} tokens: at least {length + 1} are needed")
    starts = torch.linspace(0, len(held_out_ids) - length - 1, windows).long().tolist()
    return torch.stack([held_out_ids[s : s + length] for s in starts])


learning_rate = warmup_cosine  # the tiny GPT's schedule (attnviz.core.schedule)


def held_out_steps(steps: int, count: int) -> list[int]:
    """Step 0 and ``count`` steps up to ``steps`` spaced evenly on a log scale (rounded, repeats dropped)."""
    if steps <= count:
        return list(range(steps + 1))
    return log_spaced_steps(steps, count)


def optimiser(model: nn.Module, settings: Settings) -> torch.optim.AdamW:
    """AdamW as the tiny GPT's recipe (and nanoGPT): weight decay on matrices only, not on biases and norms."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=settings.learning_rate,
                             betas=(0.9, 0.95), foreach=True)


@dataclass
class Run:
    """One training run. ``losses[s]``, ``grad_norms[s]`` and ``learning_rates[s]`` are step ``s``'s: the batch's
    loss and each block's gradient norm (before clipping) with the weights after ``s`` updates, and the learning
    rate its update used. ``held_out`` maps a step to the held-out loss after that many updates. A run whose loss
    is no longer finite stops there (``diverged_at``)."""

    norm: str
    warmup: int
    losses: list[float] = field(default_factory=list)
    grad_norms: list[list[float]] = field(default_factory=list)  # [steps][layers]
    total_grad_norms: list[float] = field(default_factory=list)  # the whole model's, before clipping
    learning_rates: list[float] = field(default_factory=list)
    held_out: dict[int, float] = field(default_factory=dict)
    diverged_at: int | None = None
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return f"{NORM_NAMES[self.norm]}, " + (f"{self.warmup} warm-up steps" if self.warmup else "no warm-up")

    @property
    def final_held_out(self) -> float:
        """The held-out loss at the last step measured (the run's end, or where it stopped)."""
        return self.held_out[max(self.held_out)]

    def smoothed_loss(self, last: int = 20) -> float:
        """The mean training loss of the last ``last`` steps (NaN when they are not finite)."""
        tail = self.losses[-last:]
        return sum(tail) / len(tail) if tail else float("nan")


@dataclass
class Result:
    """The experiment: its settings, each norm's gradient norms per block at initialisation (on the first batch),
    the four runs, and how long it took."""

    settings: Settings
    init_gradients: dict[str, list[float]]  # norm -> [layers]
    runs: list[Run]
    seconds: float
    threads: int
    text: str = ""  # what the runs trained on, in words

    def run(self, norm: str, warmed: bool) -> Run:
        return next(run for run in self.runs if run.norm == norm and bool(run.warmup) == warmed)


class Stopped(Exception):
    """The experiment was stopped (its ``cancel`` said so) before it finished."""


def init_gradients(settings: Settings, text: TrainingText) -> dict[str, list[float]]:
    """Each norm's gradient norm per block ``[layers]`` at initialisation, on the first batch of the runs (one
    backward pass each, the same weights and the same batch)."""
    generator = torch.Generator().manual_seed(settings.seed)
    batch = next(training_batches(text.train_ids, settings.batch, settings.length, generator))
    return {norm: gradient_norms(Decoder(settings.shape, norm, settings.seed), batch) for norm in NORMS}


@torch.no_grad()
def _held_out_loss(model: Decoder, windows: torch.Tensor) -> float:
    model.eval()
    loss = float(model.loss(windows))
    model.train()
    return loss


def train_run(settings: Settings, text: TrainingText, norm: str, warmup: int,
              on_step: Callable[[int], None] | None = None) -> Run:
    """One run: the model of ``settings.seed`` built with ``norm``, trained ``settings.steps`` steps with
    ``warmup`` warm-up steps. ``on_step(steps done)`` is called after each step."""
    if settings.length > settings.shape.context:
        raise ValueError(f"length {settings.length} is more than the {settings.shape.context} positions")
    started = time.perf_counter()
    model = Decoder(settings.shape, norm, settings.seed)
    model.train()
    adamw = optimiser(model, settings)
    stream = training_batches(text.train_ids, settings.batch, settings.length,
                              torch.Generator().manual_seed(settings.seed))
    windows = held_out_windows(text.held_out_ids, settings.held_out_windows, settings.length)
    measured = set(held_out_steps(settings.steps, settings.held_out_points))
    run = Run(norm, warmup, held_out={0: _held_out_loss(model, windows)})
    for step in range(settings.steps):
        rate = learning_rate(step, settings.learning_rate, warmup, settings.steps)
        for group in adamw.param_groups:
            group["lr"] = rate
        loss = model.loss(next(stream))
        adamw.zero_grad(set_to_none=True)
        loss.backward()
        run.losses.append(float(loss.detach()))
        run.grad_norms.append(block_gradient_norms(model))
        run.total_grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), settings.clip)))
        run.learning_rates.append(rate)
        if not math.isfinite(run.losses[-1]):
            run.diverged_at = step
            break
        adamw.step()
        if step + 1 in measured:
            run.held_out[step + 1] = _held_out_loss(model, windows)
        if on_step:
            on_step(step + 1)
    run.seconds = time.perf_counter() - started
    return run


def experiment(settings: Settings, text: TrainingText, progress: Callable[[float, str], None] | None = None,
               cancel: Callable[[], bool] | None = None) -> Result:
    """The gradients at initialisation and the four runs (pre-norm then post-norm, each without warm-up, then
    with). ``progress(share done, what)`` after each step; ``cancel()`` is asked after each step, and True stops
    the experiment (:class:`Stopped`, nothing kept)."""
    started = time.perf_counter()
    gradients = init_gradients(settings, text)
    plan = [(norm, warmup) for norm in NORMS for warmup in settings.warmups()]
    runs = []
    for index, (norm, warmup) in enumerate(plan):
        label = f"run {index + 1} of {len(plan)} ({NORM_NAMES[norm]}, {'warm-up' if warmup else 'no warm-up'})"

        def on_step(done: int, index=index, label=label) -> None:
            if cancel is not None and cancel():
                raise Stopped(f"stopped at step {done} of {label}")
            if progress is not None:
                progress((index + done / settings.steps) / len(plan), f"{label}: step {done} of {settings.steps}")

        runs.append(train_run(settings, text, norm, warmup, on_step))
    return Result(settings, gradients, runs, time.perf_counter() - started, torch.get_num_threads(), text.described)
