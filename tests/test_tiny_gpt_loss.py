"""The tiny GPT's fused LM-head loss against PyTorch's own ``F.cross_entropy`` on the full logits."""

import pytest
import torch
import torch.nn.functional as F

from attnviz.tiny_gpt.loss import mean_next_token_loss


def _reference(hidden, weight, targets):
    hidden = hidden.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_()
    losses = F.cross_entropy(hidden @ weight.T, targets, reduction="none")
    losses.mean().backward()
    return losses.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("rows_per_block", [1, 7, 64, 256, 1000])
def test_losses_and_gradients_equal_cross_entropy_on_the_full_logits(rows_per_block):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(300, 32, generator=generator)
    weight = torch.randn(500, 32, generator=generator) * 0.3
    targets = torch.randint(0, 500, (300,), generator=generator)
    want_losses, want_grad_hidden, want_grad_weight = _reference(hidden, weight, targets)

    hidden_in, weight_in = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    mean, losses = mean_next_token_loss(hidden_in, weight_in, targets, rows_per_block)
    (2.5 * mean).backward()  # a scale on the mean reaches both gradients

    torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean, want_losses.mean(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(hidden_in.grad, 2.5 * want_grad_hidden, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(weight_in.grad, 2.5 * want_grad_weight, rtol=1e-4, atol=1e-7)
    assert not losses.requires_grad


def test_a_tied_weight_gets_both_gradients():
    """GPT-2's LM head is its token embedding: the loss's gradient adds to the embedding's, as autograd would."""
    generator = torch.Generator().manual_seed(1)
    table = torch.randn(50, 8, generator=generator)
    ids = torch.randint(0, 50, (40,), generator=generator)
    targets = torch.randint(0, 50, (40,), generator=generator)

    def grad(fused: bool):
        weight = table.clone().requires_grad_()
        hidden = torch.tanh(F.embedding(ids, weight))  # [40, 8]
        if fused:
            mean, _ = mean_next_token_loss(hidden, weight, targets, rows_per_block=16)
        else:
            mean = F.cross_entropy(hidden @ weight.T, targets)
        mean.backward()
        return weight.grad

    torch.testing.assert_close(grad(True), grad(False), rtol=1e-4, atol=1e-7)


def test_the_training_step_gets_the_same_gradients_as_the_model_own_loss():
    """Through a GPT-2: every parameter's gradient from the fused loss equals the one from HF's logits."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=97, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                       eos_token_id=0))  # no dropout: the two passes see the same model
    batch = torch.randint(0, 97, (3, 20))

    model.zero_grad()
    logits = model(input_ids=batch).logits  # [3, 20, 97]
    F.cross_entropy(logits[:, :-1].reshape(-1, 97), batch[:, 1:].reshape(-1)).backward()
    want = {name: p.grad.clone() for name, p in model.named_parameters()}

    model.zero_grad()
    hidden = model.base_model(input_ids=batch).last_hidden_state  # [3, 20, 16]
    mean, _ = mean_next_token_loss(hidden[:, :-1].reshape(-1, 16), model.get_output_embeddings().weight,
                                   batch[:, 1:].reshape(-1), rows_per_block=8)
    mean.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_shapes_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="expected hidden"):
        mean_next_token_loss(torch.zeros(4, 8), torch.zeros(10, 7), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="rows_per_block"):
        mean_next_token_loss(torch.zeros(4, 8), torch.zeros(10, 8), torch.zeros(4, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="no rows"):
        mean_next_token_loss(torch.zeros(0, 8), torch.zeros(10, 8), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="float32"):
        mean_next_token_loss(torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(10, 8, dtype=torch.bfloat16),
                             torch.zeros(4, dtype=torch.long))
    with pytest.raises((IndexError, RuntimeError)):  # no ignore_index: every target must be a token of the vocabulary
        mean_next_token_loss(torch.zeros(4, 8), torch.zeros(10, 8), torch.tensor([0, 1, 2, -100]))


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_the_recipe_fused_step_trains_as_the_plain_one(architecture):
    """``Recipe.fused_loss``: three optimiser steps of the training script, fused and plain, from the same start
    give the same losses and the same weights, up to rounding; on both of the recipe's architectures."""
    import copy

    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from attnviz.tiny_gpt import train as train_tiny

    torch.manual_seed(0)
    if architecture == "gpt2":
        plain = GPT2LMHeadModel(GPT2Config(vocab_size=61, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                           eos_token_id=0))
    else:  # as the recipe builds it: grouped-query attention, tied embeddings
        plain = LlamaForCausalLM(LlamaConfig(vocab_size=61, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                             tie_word_embeddings=True, bos_token_id=0, eos_token_id=0))
    fused, start = copy.deepcopy(plain), copy.deepcopy(plain)
    recipe = train_tiny.Recipe()
    optimisers = {id(m): train_tiny._optimiser(m, recipe) for m in (plain, fused)}
    generator = torch.Generator().manual_seed(3)
    for _ in range(3):
        batch = torch.randint(0, 61, (4, 16), generator=generator)
        positions = torch.arange(16).expand(4, 16)
        want = train_tiny._training_step(plain, optimisers[id(plain)], batch, positions, 61)
        got = train_tiny._training_step(fused, optimisers[id(fused)], batch, positions, 61, fused_loss=True)
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
    # Adam divides each gradient by its own size, so a rounding difference in a near-zero gradient can move its
    # weight by a visible share of a step (lr 2e-3): within 5e-5, under 1% of the 3 steps' reach
    for (name, p), q in zip(plain.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=5e-5, msg=name)
    moved = max(float((p - q).abs().max()) for p, q in zip(plain.parameters(), start.parameters(), strict=True))
    assert moved > 1e-3  # the steps did train


def test_the_command_line_asks_for_the_fused_loss(monkeypatch, tmp_path):
    from attnviz.tiny_gpt import train as train_tiny

    recipes = []
    monkeypatch.setattr(train_tiny, "train", lambda recipe, out, threads: recipes.append(recipe) or {
        "seconds": 1.0, "held_out_loss": 1.0, "circuits": {"previous_token": [[0.0]], "induction": [[0.0]]}})
    train_tiny.main(["--out", str(tmp_path), "--fused-loss"])
    train_tiny.main(["--out", str(tmp_path)])
    assert [r.fused_loss for r in recipes] == [True, False]


def test_an_lm_head_with_a_bias_is_refused_by_the_fused_step():
    from transformers import GPT2Config, GPT2LMHeadModel

    from attnviz.tiny_gpt import train as train_tiny

    model = GPT2LMHeadModel(GPT2Config(vocab_size=11, n_positions=8, n_embd=8, n_layer=1, n_head=2, bos_token_id=0,
                                       eos_token_id=0))
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(11))
    optimiser = torch.optim.AdamW(model.parameters())
    batch = torch.randint(0, 11, (2, 8))
    with pytest.raises(ValueError, match="without bias"):
        train_tiny._training_step(model, optimiser, batch, torch.arange(8).expand(2, 8), 11, fused_loss=True)
