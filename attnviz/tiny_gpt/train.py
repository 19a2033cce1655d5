"""``python -m attnviz.tiny_gpt.train``: train the bundled tiny GPT, seeded, on the CPU, in minutes.

The model is a GPT-2 (transformers' ``GPT2LMHeadModel``: learned positions, LayerNorm, GELU MLP) small enough to
train on a laptop and to read head by head: 3 layers, 4 heads, d_model 128, a context of 256 tokens, a byte-level
BPE vocabulary of 4,096 tokens trained on the same text and on the most frequent English words (the ``wordfreq``
package's list, a test-only extra), so that everyday words are single tokens. (``--architecture llama`` trains a
Llama with RoPE and grouped-query attention instead; its induction heads came out more diffuse in our runs.) The
text is Python's own documentation (``pydoc_data.topics``) and the standard library's docstrings, shipped with
every Python, so training needs nothing from the internet.

Batches mix two kinds of sequence: windows of the documentation (what the model predicts on the page), and
random tokens repeated (``A B C ... A B C ...``), which teach the two-layer induction circuit fast (Olsson et al.,
2022): a previous-token head in layer 0 and an induction head in a later layer that reads it (layer 2 in the shipped
model). The circuits form on 128-token sequences (the shipped run's phase change: steps 3,720 to 4,433, in its
``over-training/measures.json``); the rest of training uses whole 256-token sequences, with
positions 128-255 starting as copies of 0-127, so that every position the model has is trained. The last 10% of
the documentation is held out: the losses and the previous-token score are measured on it.

The folder written (weights, tokenizer, ``README.md`` model card, ``training.json``) loads with
``AutoModelForCausalLM`` and ``AutoTokenizer`` like any checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from attnviz.core import circuits, positional
from attnviz.core.schedule import warmup_cosine
from attnviz.interventions.training_measures import make_probe
from attnviz.models.shipped import BUNDLED_GPT_DIR
from attnviz.tiny_gpt.batches import batch_rows, batches, frequent_tokens
from attnviz.tiny_gpt.card import model_card
from attnviz.tiny_gpt.evaluation import held_out_halves, held_out_loss, measure_circuits, measure_generalisation
from attnviz.tiny_gpt.loss import mean_next_token_loss
from attnviz.tiny_gpt.recording import Recorder
from attnviz.tiny_gpt.text import (
    HELD_OUT_SHARE,
    app_words,
    documentation_text,
    split_text,
    standard_library_docstrings,
)
from attnviz.tiny_gpt.words import (
    EOS,
    RARE_WORD_COUNT,
    KeptDirections,
    rare_word_rows,
    start_from_bert,
    train_tokenizer,
)

BUNDLED_DIR = BUNDLED_GPT_DIR


@dataclass
class Recipe:
    architecture: str = "gpt2"  # or "llama"
    # A few thousand tokens, so that the words people type are single tokens (with 512, nine in ten of the 300 most
    # frequent English words were split; with 4,096 and ``common_words``, no word of letters among the 1,000 most
    # frequent: only contractions and digits are). Trained
    # on the documentation alone, a 2,048-token model's layer-0 heads averaged the last few tokens; with the
    # docstrings too its previous-token head formed (docs/benchmarks.md).
    vocab_size: int = 4096
    context: int = 256  # positions the model has
    train_length: int = 128  # tokens per training sequence
    # Learned positions that no training sequence reaches stay near their random start, and the model loses its
    # way past them; two ways to train every position of the context:
    # this share of each batch's rows sits at a random offset in the context (position ids offset + 0..length-1),
    shifted_share: float = 0.0
    # and the last ``long_steps`` steps train on whole-context sequences (half the rows: the same tokens a step),
    long_steps: int = 3000
    # GPT-2 only: as they start, the untrained positions take a copy of the trained ones (position train_length + j
    # starts as j), as Longformer extended RoBERTa's 512 positions.
    copy_positions: bool = True
    # Three layers: with two, greedy decoding gave the fourth word of 15 of the 24 test sentences typed again (most
    # misses where a piece occurs twice in the sentence); with three, 22 (docs/benchmarks.md).
    n_layer: int = 3
    n_head: int = 4
    n_kv_head: int = 2  # grouped-query attention: two query heads share each K/V head
    n_embd: int = 128
    intermediate: int = 384
    steps: int = 7500
    batch: int = 16
    learning_rate: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.1
    repeat_share: float = 0.5  # of each batch: repeated random tokens
    # They are drawn from this many most frequent tokens of the text; 0: from every ordinary token, as Olsson et
    # al. test induction (a pool of frequent tokens leaves the rest untrained for copying).
    repeat_pool: int = 0
    # The period of a repeated sequence is drawn from this range, capped at half the sequence (two copies at least).
    repeat_periods: tuple[int, int] = (8, 129)
    # Of the repeated rows, this share draws from only ``small_pool`` tokens of the pool: with few distinct
    # tokens, a key that mixes positions j, j-1 and j-2 no longer tells the occurrences apart, so the copy needs
    # a previous-token head that reads exactly j-1.
    small_pool_share: float = 0.0
    # Of the repeated rows, this share repeats a window of the documentation instead of random tokens: induction
    # learned on random tokens alone stays off on ordinary text (a sentence typed twice cost 0.92x the first time).
    text_repeat_share: float = 0.75
    # ... each made of short windows (token counts drawn from this range) taken from random places of the text:
    # English the model cannot recite from memory, so predicting the second copy takes copying. (0: one window.)
    text_repeat_span: tuple[int, int] = (4, 13)
    small_pool: int = 16
    # Of each batch (taken from the documentation's rows): random tokens in echoed triples ``a b a  c d c ...``.
    # At each triple's middle token the next one is exactly the token before it: a head that reads only i-1
    # predicts it, one that mixes in i-2 (the previous triple) does not.
    echo_share: float = 0.0
    held_out_share: float = HELD_OUT_SHARE
    seed: int = 0
    # Options tried for a sharper previous-token head (docs/benchmarks.md); the defaults are the shipped recipe.
    position_init: str = "learned"  # or "sinusoidal": GPT-2's positions start as the original Transformer's
    position_scale: float = 0.1  # ... times this, so that they neither drown nor vanish beside token embeddings
    freeze_positions: bool = False  # keep them sinusoidal (not trained)
    docstrings: bool = True  # also train on the docstrings of Python's standard library (4x the text)
    # The BPE also learns from this many of the most frequent English words (wordfreq's list, each repeated by its
    # frequency), so that everyday words a user types are single tokens, not only Python's vocabulary. The model
    # itself never trains on the list; those tokens learn to be copied from the repeated random rows.
    common_words: int = 3000
    # The words of the app's own sentences (attnviz.tiny_gpt.text.APP_SENTENCES: "The cat sat on the mat ...",
    # "A kitten rested on the rug.") are counted as often as the most frequent English words, so each is one token.
    app_words: bool = True
    # "bert": the first half of each whole word's embedding (`` cat``) starts as the bundled BERT's embedding of the
    # word, projected on its top principal components; the rest starts random. Python's documentation never mentions a
    # kitten, so without them nothing tells the model that kitten and cat are alike. "random": GPT-2's own start.
    word_embeddings: str = "bert"
    bert_dims: int = 32  # ... in this many of the d_model dimensions (the rest train: they tell similar words apart)
    # Llama only: biases on the Q/K/V/O projections. With RoPE, a bias-only query and key give a score that depends
    # on the offset j - i alone, the same for every token, so "attend one back" is one pair of vectors to learn.
    attention_bias: bool = False
    # GPT-2 only: False drops the 1/sqrt(d_head) of the scores (GPT2Config.scale_attn_weights), so that the same
    # weights give logits sqrt(d_head) times larger: a sharp pattern costs less weight (and weight decay).
    scale_attention: bool = True
    # The LM head and its cross-entropy fused, a block of rows at a time (attnviz.tiny_gpt.loss): the same loss and
    # gradients up to rounding, about a fifth less time a step on a 2-core CPU (docs/benchmarks.md, 2026-12-07).
    # Off in the shipped recipe: with it, a run is not bit for bit the shipped model's.
    fused_loss: bool = False


def learning_rate(step: int, recipe: Recipe) -> float:
    """The recipe's schedule: linear warm-up, then cosine decay to a tenth
    (:func:`attnviz.core.schedule.warmup_cosine`)."""
    return warmup_cosine(step, recipe.learning_rate, recipe.warmup, recipe.steps)


def build_model(recipe: Recipe, tokenizer):
    """A fresh decoder of ``recipe.architecture``: "llama" (RoPE, GQA) or "gpt2" (learned positions)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if recipe.architecture == "gpt2":
        config = GPT2Config(vocab_size=recipe.vocab_size, n_positions=recipe.context, n_embd=recipe.n_embd,
                            n_layer=recipe.n_layer, n_head=recipe.n_head, n_inner=recipe.intermediate,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, scale_attn_weights=recipe.scale_attention,
                            bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id)
        model = GPT2LMHeadModel(config)
        if recipe.position_init == "sinusoidal":
            # Learned positions start with no structure, and a previous-token head has to discover "one position
            # back" for each of the 256 positions separately; from sinusoids, it is one linear map (a rotation per
            # frequency) that W_Q and W_K can learn once.
            with torch.no_grad():
                model.transformer.wpe.weight.copy_(positional.sinusoidal(recipe.context, recipe.n_embd)
                                                   * recipe.position_scale)
            model.transformer.wpe.weight.requires_grad_(not recipe.freeze_positions)
        return model
    config = LlamaConfig(vocab_size=recipe.vocab_size, hidden_size=recipe.n_embd,
                         intermediate_size=recipe.intermediate, num_hidden_layers=recipe.n_layer,
                         num_attention_heads=recipe.n_head, num_key_value_heads=recipe.n_kv_head,
                         max_position_embeddings=recipe.context, tie_word_embeddings=True,
                         attention_bias=recipe.attention_bias,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config)


@torch.no_grad()
def transplant_word_embeddings(model, tokenizer, dims: int) -> list[int]:
    """:func:`attnviz.tiny_gpt.words.start_from_bert` with the bundled BERT's embedding table and vocabulary:
    the first ``dims`` dimensions of ``model``'s whole-word embeddings start as BERT's. Returns their token ids."""
    from attnviz.models.loading import load_model_dir
    from attnviz.models.shipped import DEFAULT_MODEL_NAME, bundled_models

    bert = load_model_dir(bundled_models()[DEFAULT_MODEL_NAME], name=DEFAULT_MODEL_NAME)
    return start_from_bert(model.get_input_embeddings().weight, tokenizer.get_vocab(),
                           bert.model.get_input_embeddings().weight, bert.tokenizer.get_vocab(), dims)


def copies_positions(recipe: Recipe) -> bool:
    """Whether the long phase starts by copying trained positions over untrained ones: a GPT-2 with learned
    positions (RoPE has no table; a sinusoidal table is already defined everywhere), shorter sequences before it."""
    return (recipe.copy_positions and recipe.long_steps > 0 and recipe.architecture == "gpt2"
            and recipe.position_init == "learned" and recipe.train_length < recipe.context)


def long_batch_size(recipe: Recipe) -> int:
    """Rows of a whole-context batch: as many tokens a step as the ordinary batches."""
    return max(2, recipe.batch * recipe.train_length // recipe.context)


@torch.no_grad()
def extend_positions(model, trained: int) -> None:
    """Copy a GPT-2's first ``trained`` learned positions over the rest of its table, period ``trained``."""
    table = model.transformer.wpe.weight  # [context, d_model]
    for start in range(trained, len(table), trained):
        table[start : start + trained] = table[: min(trained, len(table) - start)]


def _check_recipe(recipe: Recipe) -> None:
    if recipe.train_length > recipe.context:
        raise ValueError(f"train_length {recipe.train_length} is more than the {recipe.context} positions")
    if recipe.word_embeddings == "bert" and not 0 < recipe.bert_dims <= recipe.n_embd:
        raise ValueError(f"bert_dims must be between 1 and d_model ({recipe.n_embd})")
    if not 0 <= recipe.long_steps < recipe.steps:
        raise ValueError(f"long_steps must be at least 0 and below the {recipe.steps} steps")


def _optimiser(model, recipe: Recipe) -> torch.optim.AdamW:
    """AdamW as nanoGPT sets it up: weight decay on matrices only, not on biases and norms."""
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    decay = [p for name, p in trained if p.ndim >= 2]
    no_decay = [p for name, p in trained if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=recipe.learning_rate,
                             betas=(0.9, 0.95))


def _training_step(model, optimiser, batch: torch.Tensor, positions: torch.Tensor, vocab_size: int,
                   fused_loss: bool = False) -> torch.Tensor:
    """One optimiser step on next-token prediction; returns each row's per-token losses ``[batch, length - 1]``.
    ``fused_loss``: the LM head and its loss a block of rows at a time (:mod:`attnviz.tiny_gpt.loss`)."""
    if fused_loss:
        head = model.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ValueError("the fused loss takes an LM head without bias (GPT-2's and Llama's have none)")
        hidden = model.base_model(input_ids=batch, position_ids=positions).last_hidden_state  # [batch, length, d]
        mean, losses = mean_next_token_loss(hidden[:, :-1].reshape(-1, hidden.shape[-1]),  # [batch * (length-1), d]
                                            head.weight, batch[:, 1:].reshape(-1))
        losses = losses.view(batch.shape[0], -1)
    else:
        logits = model(input_ids=batch, position_ids=positions).logits  # [batch, length, vocab]
        losses = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, vocab_size), batch[:, 1:].reshape(-1), reduction="none",
        ).view(batch.shape[0], -1)
        mean = losses.mean()
    optimiser.zero_grad(set_to_none=True)
    mean.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimiser.step()
    return losses


def _progress_line(step: int, losses: torch.Tensor, rows: tuple[int, int, int], seconds: float) -> str:
    """The log line of a step: the loss overall, on the documentation rows, on the repeats' second halves and on
    the echoes' middles (the rows of each kind, in the batch's order: ``rows``)."""
    n_text, n_repeats, n_echoes = rows
    half = (losses.shape[1] + 1) // 2
    repeats = losses[n_text:n_text + n_repeats, half:].mean().item() if n_repeats else 0.0
    echoes = f"  echoes (middles) {losses[n_text + n_repeats:, 1::3].mean().item():.3f}" if n_echoes else ""
    return (f"step {step:5d}  loss {losses.mean().item():.3f}  documentation {losses[:n_text].mean().item():.3f}  "
            f"repeats (second half) {repeats:.3f}{echoes}  {seconds:6.0f} s")


@dataclass
class _Prepared:
    """What a run trains on and with, before its first step."""

    train_text: str
    held_out_text: str
    topics_chars: int
    tokenizer: object
    train_ids: torch.Tensor
    held_out_ids: torch.Tensor
    model: object
    transplanted: list[int]
    kept: KeptDirections | None
    pool: list[int]


def _prepare(recipe: Recipe) -> _Prepared:
    """The text (split), the tokenizer trained on it, the model built (with BERT's word embeddings when asked) and
    the pool of tokens the repeated sequences draw from; in the seeded order the shipped model was made in."""
    train_text, held_out_text = split_text(documentation_text(), recipe.held_out_share)
    topics_chars = len(train_text)
    if recipe.docstrings:
        train_text = train_text + "\n\n" + standard_library_docstrings()
    tokenizer = train_tokenizer(train_text, recipe.vocab_size, recipe.common_words,
                                tuple(app_words()) if recipe.app_words else ())
    train_ids = torch.tensor(tokenizer(train_text)["input_ids"])
    held_out_ids = torch.tensor(tokenizer(held_out_text)["input_ids"])
    model = build_model(recipe, tokenizer)
    transplanted = (transplant_word_embeddings(model, tokenizer, recipe.bert_dims) if recipe.word_embeddings == "bert"
                    else [])
    kept = (KeptDirections(model.get_input_embeddings().weight, rare_word_rows(tokenizer, train_ids, transplanted),
                           recipe.bert_dims) if transplanted else None)
    pool = (frequent_tokens(train_ids, recipe.repeat_pool, skip=len(tokenizer.all_special_ids)) if recipe.repeat_pool
            else circuits.ordinary_token_ids(tokenizer))
    return _Prepared(train_text, held_out_text, topics_chars, tokenizer, train_ids, held_out_ids, model, transplanted,
                     kept, pool)


def _run_steps(recipe: Recipe, ready: _Prepared, log, on_step=None) -> tuple[list[float], float]:
    """Every training step (the last ``long_steps`` on whole-context rows): the documentation rows' mean loss per
    step, and the seconds it took. ``on_step(steps done, model)``: called before the first step and after each."""
    model = ready.model
    model.train()
    optimiser = _optimiser(model, recipe)
    generator = torch.Generator().manual_seed(recipe.seed)
    stream = batches(ready.train_ids, recipe, generator, ready.pool)
    # The last steps: whole-context sequences, half as many (a step sees the same number of tokens).
    long_recipe = replace(recipe, train_length=recipe.context, batch=long_batch_size(recipe), shifted_share=0.0)
    long_stream = batches(ready.train_ids, long_recipe, generator, ready.pool) if recipe.long_steps else None
    started = time.perf_counter()
    text_losses: list[float] = []
    if on_step:
        on_step(0, model)
    for step in range(recipe.steps):
        for group in optimiser.param_groups:
            group["lr"] = learning_rate(step, recipe)
        long = step >= recipe.steps - recipe.long_steps
        if long and step == recipe.steps - recipe.long_steps and copies_positions(recipe):
            extend_positions(model, recipe.train_length)
        batch, positions = next(long_stream if long else stream)
        losses = _training_step(model, optimiser, batch, positions, recipe.vocab_size,  # [batch, length - 1]
                                recipe.fused_loss)
        if ready.kept is not None:
            ready.kept.restore()
        if on_step:
            on_step(step + 1, model)
        rows = batch_rows(long_recipe if long else recipe)
        text_losses.append(losses[:rows[0]].mean().item())
        if step % 100 == 0 or step == recipe.steps - 1:
            log(_progress_line(step, losses, rows, time.perf_counter() - started))
    return text_losses, time.perf_counter() - started


def train(recipe: Recipe, out: Path, log=print, threads: int = 1) -> dict:
    """Train the tiny GPT by ``recipe`` on ``threads`` CPU threads (0: every core), save it in ``out`` with its
    tokenizer, measure it, and write its ``training.json`` and model card; returns the report."""
    _check_recipe(recipe)
    began = time.perf_counter()
    torch.manual_seed(recipe.seed)
    threads = threads or os.cpu_count() or 1  # 0: every core
    torch.set_num_threads(threads)
    ready = _prepare(recipe)
    # measured at log-spaced steps on held-out text and repeated random tokens (its own generator: the run's
    # batches are the same with or without it)
    recorder = Recorder(make_probe(ready.held_out_ids, ready.pool, bos=ready.tokenizer.bos_token_id), recipe.steps,
                        log)
    text_losses, seconds = _run_steps(recipe, ready, log, recorder)
    model, kept = ready.model, ready.kept
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    ready.tokenizer.save_pretrained(out)
    report = {
        "recipe": asdict(recipe), "seconds": seconds, "threads": threads, "torch": torch.__version__,
        "python": platform.python_version(), "parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens": len(ready.train_ids), "bert_word_embeddings": len(ready.transplanted),
        "kept_word_directions": 0 if kept is None else len(kept.rows), "held_out_tokens": len(ready.held_out_ids),
        "topics_share": ready.topics_chars / len(ready.train_text),
        "final_train_loss": sum(text_losses[-50:]) / len(text_losses[-50:]),
        "held_out_loss": held_out_loss(model, ready.held_out_ids, recipe.train_length),
        "held_out_loss_by_half": held_out_halves(model, ready.held_out_ids, recipe.context),
        "repeat_token_ids": ready.pool,
        "circuits": measure_circuits(out, ready.held_out_text, ready.pool, recipe.context),
        **measure_generalisation(out),
    }
    series = recorder.save(out, model, ready.tokenizer, {"seconds": seconds, "threads": threads,
                                                         "torch": torch.__version__})
    report["over_training"] = {"measured_steps": len(series["rows"]), "phase_change": series["phase_change"],
                               "snapshots": series["snapshots"],
                               "icl_by_step": {row["step"]: row["icl"] for row in series["rows"]}}
    report["total_seconds"] = time.perf_counter() - began  # the whole run: text, tokenizer, steps, measures
    (out / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "README.md").write_text(model_card(recipe, report, long_batch=long_batch_size(recipe),
                                               copied_positions=copies_positions(recipe), eos=EOS,
                                               rare_count=RARE_WORD_COUNT))
    return report


def _parser(prog: str, out: Path) -> argparse.ArgumentParser:
    """The command line: every option of the recipe, with the shipped recipe's values as defaults."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=Recipe.steps)
    parser.add_argument("--seed", type=int, default=Recipe.seed)
    parser.add_argument("--repeat-share", type=float, default=Recipe.repeat_share)
    parser.add_argument("--learning-rate", type=float, default=Recipe.learning_rate)
    parser.add_argument("--weight-decay", type=float, default=Recipe.weight_decay)
    parser.add_argument("--architecture", choices=("llama", "gpt2"), default=Recipe.architecture)
    parser.add_argument("--heads", type=int, default=Recipe.n_head)
    parser.add_argument("--layers", type=int, default=Recipe.n_layer)
    parser.add_argument("--kv-heads", type=int, default=Recipe.n_kv_head)
    parser.add_argument("--position-init", choices=("sinusoidal", "learned"), default=Recipe.position_init)
    parser.add_argument("--position-scale", type=float, default=Recipe.position_scale)
    parser.add_argument("--freeze-positions", action="store_true")
    parser.add_argument("--no-docstrings", action="store_true",
                        help="train on the documentation topics only, not the standard library's docstrings")
    parser.add_argument("--common-words", type=int, default=Recipe.common_words,
                        help="the BPE also learns this many most frequent English words (needs wordfreq)")
    parser.add_argument("--no-app-words", action="store_true",
                        help="do not keep the words of the app's own sentences whole in the BPE")
    parser.add_argument("--word-embeddings", choices=("bert", "random"), default=Recipe.word_embeddings,
                        help="bert: whole-word tokens start as the bundled BERT's embeddings of those words")
    parser.add_argument("--bert-dims", type=int, default=Recipe.bert_dims,
                        help="the dimensions of a whole word's embedding that start as BERT's")
    parser.add_argument("--small-pool-share", type=float, default=Recipe.small_pool_share)
    parser.add_argument("--text-repeat-share", type=float, default=Recipe.text_repeat_share,
                        help="share of the repeated rows that repeat a window of the text")
    parser.add_argument("--text-repeat-span", type=int, nargs=2, default=Recipe.text_repeat_span,
                        help="token counts of the text windows a repeated text row is made of (0 0: one window)")
    parser.add_argument("--small-pool", type=int, default=Recipe.small_pool)
    parser.add_argument("--echo-share", type=float, default=Recipe.echo_share,
                        help="share of each batch in echoed random triples (a b a)")
    parser.add_argument("--no-attention-scaling", action="store_true",
                        help="GPT-2: scores without the 1/sqrt(d_head)")
    parser.add_argument("--attention-bias", action="store_true", help="Llama: biases on the attention projections")
    parser.add_argument("--vocab-size", type=int, default=Recipe.vocab_size,
                        help="BPE vocabulary size (smaller: more tokens are pieces of words)")
    parser.add_argument("--repeat-pool", type=int, default=Recipe.repeat_pool,
                        help="repeated random tokens are drawn from this many most frequent tokens")
    parser.add_argument("--train-length", type=int, default=Recipe.train_length,
                        help="tokens per training sequence (at most the context)")
    parser.add_argument("--batch", type=int, default=Recipe.batch, help="sequences per step")
    parser.add_argument("--shifted-share", type=float, default=Recipe.shifted_share,
                        help="share of the rows placed at a random offset in the context")
    parser.add_argument("--long-steps", type=int, default=Recipe.long_steps,
                        help="the last steps train on whole-context sequences")
    parser.add_argument("--no-copy-positions", action="store_true",
                        help="GPT-2: the untrained positions keep their random start (with --long-steps)")
    parser.add_argument("--fused-loss", action="store_true",
                        help="the LM head and its loss fused, a block of rows at a time: about a fifth less time a "
                             "step on a CPU, the same arithmetic up to rounding (not bit for bit the shipped model)")
    parser.add_argument("--threads", type=int, default=2,
                        help="CPU threads (default 2, as the shipped model was trained: the same numbers run after run "
                             "on one machine; another count can change the rounding; 0: every core)")
    parser.add_argument("--out", type=Path, default=out, help=f"where to write the model folder (default: {out})")
    return parser


def _recipe_of(args: argparse.Namespace) -> Recipe:
    """The recipe the command line asks for."""
    return Recipe(steps=args.steps, seed=args.seed, repeat_share=args.repeat_share,
                  learning_rate=args.learning_rate, n_head=args.heads, n_kv_head=args.kv_heads,
                  n_layer=args.layers,
                  weight_decay=args.weight_decay, architecture=args.architecture,
                  position_init=args.position_init, position_scale=args.position_scale,
                  freeze_positions=args.freeze_positions, docstrings=not args.no_docstrings,
                  common_words=args.common_words, app_words=not args.no_app_words,
                  word_embeddings=args.word_embeddings, bert_dims=args.bert_dims,
                  small_pool_share=args.small_pool_share, small_pool=args.small_pool,
                  text_repeat_share=args.text_repeat_share, text_repeat_span=tuple(args.text_repeat_span),
                  attention_bias=args.attention_bias, echo_share=args.echo_share,
                  scale_attention=not args.no_attention_scaling, vocab_size=args.vocab_size,
                  repeat_pool=args.repeat_pool, train_length=args.train_length, batch=args.batch,
                  shifted_share=args.shifted_share, long_steps=args.long_steps,
                  copy_positions=not args.no_copy_positions, fused_loss=args.fused_loss)


def main(argv: list[str] | None = None, prog: str = "python -m attnviz.tiny_gpt.train",
         out: Path = BUNDLED_DIR) -> None:
    """Train and write the model folder. ``python -m attnviz.tiny_gpt.train`` writes the bundled model itself (how
    the shipped one was made); ``attnviz train-tiny`` writes ``./tiny-gpt`` unless told otherwise, never into the
    installed package."""
    args = _parser(prog, out).parse_args(argv)
    report = train(_recipe_of(args), args.out, threads=args.threads)
    circuits_found = report["circuits"]
    print(f"wrote {args.out} in {report['seconds'] / 60:.1f} min: held-out loss {report['held_out_loss']:.3f}; "
          f"best previous-token score {max(max(r) for r in circuits_found['previous_token']):.3f}, "
          f"best induction score {max(max(r) for r in circuits_found['induction']):.3f}")


if __name__ == "__main__":
    main()
