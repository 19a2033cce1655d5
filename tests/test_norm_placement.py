"""Pre-norm against post-norm (attnviz.interventions.norm_placement): the decoder against independent references
(transformers' GPT-2, torch's TransformerEncoderLayer), its gradient norms against a hand computation, its batches and
schedule against the tiny GPT's training script, the measured gradients at initialisation, the words against
constructed results, and the section in AppTest. Tiny shapes and a handful of steps: a few seconds in all."""

import math
from dataclasses import replace

import pytest
import torch
from streamlit.testing.v1 import AppTest

from attnviz.interventions import norm_placement as npl
from attnviz.pagelogic import norm_placement as logic
from attnviz.viz import norm_placement as figures
from tests.apptest_helpers import figure_titled

SMALL = npl.Shape(vocab_size=61, context=16, n_layer=2, n_head=4, d_model=32, d_mlp=48)


def perturbed(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Every parameter moved off GPT-2's start (biases and LayerNorms too), so a copy that drops one shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model


def test_pre_norm_is_gpt2_logits_loss_and_gradients():
    """The pre-norm decoder is GPT-2: transformers' GPT2LMHeadModel with the same weights gives the same logits,
    loss and gradients."""
    from transformers import GPT2Config, GPT2LMHeadModel

    ours = perturbed(npl.Decoder(SMALL, "pre", seed=0))
    config = GPT2Config(vocab_size=SMALL.vocab_size, n_positions=SMALL.context, n_embd=SMALL.d_model,
                        n_layer=SMALL.n_layer, n_head=SMALL.n_head, n_inner=SMALL.d_mlp, activation_function="gelu_new",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=SMALL.layer_norm_eps,
                        tie_word_embeddings=True)
    config._attn_implementation = "eager"
    reference = GPT2LMHeadModel(config)
    # ours -> GPT-2's names; GPT-2's Conv1D stores [in, out], a Linear [out, in]
    pairs = {"wte.weight": ("transformer.wte.weight", False), "wpe.weight": ("transformer.wpe.weight", False),
             "ln_f.weight": ("transformer.ln_f.weight", False), "ln_f.bias": ("transformer.ln_f.bias", False)}
    for layer in range(SMALL.n_layer):
        for ours_name, theirs in (("ln_1", "ln_1"), ("ln_2", "ln_2"), ("attn.qkv", "attn.c_attn"),
                                  ("attn.proj", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")):
            linear = "ln" not in ours_name
            pairs[f"blocks.{layer}.{ours_name}.weight"] = (f"transformer.h.{layer}.{theirs}.weight", linear)
            pairs[f"blocks.{layer}.{ours_name}.bias"] = (f"transformer.h.{layer}.{theirs}.bias", False)
    mine, theirs = dict(ours.named_parameters()), dict(reference.named_parameters())
    assert set(mine) == set(pairs)
    with torch.no_grad():
        for name, (other, transposed) in pairs.items():
            theirs[other].copy_(mine[name].T if transposed else mine[name])
    ids = torch.randint(0, SMALL.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    out = reference(input_ids=ids, labels=ids)
    torch.testing.assert_close(ours(ids), out.logits, atol=1e-5, rtol=1e-5)
    loss = ours.loss(ids)
    torch.testing.assert_close(loss, out.loss, atol=1e-6, rtol=1e-6)
    loss.backward()
    out.loss.backward()
    for name, (other, transposed) in pairs.items():
        expected = theirs[other].grad.T if transposed else theirs[other].grad
        torch.testing.assert_close(mine[name].grad, expected, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("norm", npl.NORMS)
def test_block_is_torch_encoder_layer_with_a_causal_mask(norm):
    """A block is torch's TransformerEncoderLayer (norm_first=False: post-norm; True: pre-norm) with a causal mask,
    exact GELU and no dropout: the same output and the same gradients."""
    shape = npl.Shape(vocab_size=11, context=16, n_head=4, d_model=32, d_mlp=48, gelu="none")
    block = perturbed(npl.Block(shape, norm))
    reference = torch.nn.TransformerEncoderLayer(shape.d_model, shape.n_head, shape.d_mlp, dropout=0.0,
                                                 activation="gelu", batch_first=True, norm_first=norm == "pre",
                                                 layer_norm_eps=shape.layer_norm_eps)
    pairs = {"attn.qkv.weight": "self_attn.in_proj_weight", "attn.qkv.bias": "self_attn.in_proj_bias",
             "attn.proj.weight": "self_attn.out_proj.weight", "attn.proj.bias": "self_attn.out_proj.bias",
             "mlp.fc.weight": "linear1.weight", "mlp.fc.bias": "linear1.bias",
             "mlp.proj.weight": "linear2.weight", "mlp.proj.bias": "linear2.bias",
             "ln_1.weight": "norm1.weight", "ln_1.bias": "norm1.bias", "ln_2.weight": "norm2.weight",
             "ln_2.bias": "norm2.bias"}
    mine, theirs = dict(block.named_parameters()), dict(reference.named_parameters())
    assert set(mine) == set(pairs) and set(theirs) == set(pairs.values())
    with torch.no_grad():
        for name, other in pairs.items():
            theirs[other].copy_(mine[name])
    x = torch.randn(2, 10, shape.d_model, generator=torch.Generator().manual_seed(0))
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    mask = torch.nn.Transformer.generate_square_subsequent_mask(10)  # [10, 10]: -inf above the diagonal
    ours_out, their_out = block(x_ours), reference(x_theirs, src_mask=mask, is_causal=True)
    torch.testing.assert_close(ours_out, their_out, atol=1e-5, rtol=1e-5)
    weights = torch.randn(ours_out.shape, generator=torch.Generator().manual_seed(1))
    (ours_out * weights).sum().backward()
    (their_out * weights).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, atol=1e-5, rtol=1e-4)
    for name, other in pairs.items():
        torch.testing.assert_close(mine[name].grad, theirs[other].grad, atol=1e-5, rtol=1e-4, msg=name)


def test_both_placements_have_the_same_parameters_and_gpt2_start():
    pre, post = npl.Decoder(SMALL, "pre", seed=3), npl.Decoder(SMALL, "post", seed=3)
    assert sum(p.numel() for p in pre.parameters()) == sum(p.numel() for p in post.parameters())
    post_blocks = dict(post.blocks.named_parameters())
    for name, value in pre.blocks.named_parameters():
        assert torch.equal(value, post_blocks[name]), name
    assert torch.equal(pre.wte.weight, post.wte.weight) and torch.equal(pre.wpe.weight, post.wpe.weight)
    assert not torch.equal(pre.wte.weight, npl.Decoder(SMALL, "pre", seed=4).wte.weight)
    big = npl.Decoder(npl.Shape(), "pre", seed=0)  # GPT-2's start: std 0.02, output projections / sqrt(2 x layers)
    assert big.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert big.blocks[1].mlp.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(6), rel=0.02)
    assert big.blocks[2].attn.qkv.bias.abs().max() == 0 and torch.all(big.ln_f.weight == 1)


def test_gradient_norms_are_each_blocks_gradient_norm():
    """Against the block's .grad concatenated by hand, and against torch.autograd.grad on a fresh copy."""
    model = npl.Decoder(SMALL, "post", seed=2)
    ids = torch.randint(0, SMALL.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    found = npl.gradient_norms(model, ids)
    assert len(found) == SMALL.n_layer
    by_hand = [torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in block.parameters()])).item()
               for block in model.blocks]
    assert found == pytest.approx(by_hand, rel=1e-6)
    fresh = npl.Decoder(SMALL, "post", seed=2)
    loss = fresh.loss(ids)
    for layer, block in enumerate(fresh.blocks):
        grads = torch.autograd.grad(loss, list(block.parameters()), retain_graph=True)
        assert found[layer] == pytest.approx(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads])).item(),
                                             rel=1e-5)


def test_batches_and_schedule_are_the_tiny_gpts():
    """The documentation rows of attnviz.tiny_gpt.train.batches, and its learning-rate schedule."""
    from attnviz.tiny_gpt.train import Recipe, batches
    from attnviz.tiny_gpt.train import learning_rate as recipe_rate

    ids = torch.arange(5000) % 4096
    recipe = Recipe(batch=8, train_length=64, repeat_share=0.0, echo_share=0.0, seed=0)
    theirs = batches(ids, recipe, torch.Generator().manual_seed(5), pool=[])
    ours = npl.training_batches(ids, 8, 64, torch.Generator().manual_seed(5))
    for _ in range(3):
        tokens, positions = next(theirs)
        assert torch.equal(next(ours), tokens)
        assert torch.equal(positions, torch.arange(64).expand(8, 64))
    for warmup in (0, 50):
        schedule = Recipe(learning_rate=1e-2, warmup=warmup, steps=200)
        for step in (0, 1, 25, 49, 50, 51, 150, 199):
            assert npl.learning_rate(step, 1e-2, warmup, 200) == pytest.approx(recipe_rate(step, schedule))


@pytest.fixture(scope="module")
def text():
    return logic.bundled_text()


def test_post_norm_gradient_ratio_at_init_is_above_pre_norms(text):
    """Measured on the tiny GPT's text at the page's seed and two more: the last block's gradient over the first's is
    higher with post-norm. What the numbers are (seed 0: pre-norm 0.653, post-norm 0.998) is the page's point: at
    GPT-2's start post-norm's are level, not growing, and it is pre-norm's that fall towards the output."""
    for seed in (npl.Settings().seed, 1, 2):
        gradients = npl.init_gradients(npl.Settings(seed=seed), text)
        pre, post = logic.ratio(gradients["pre"]), logic.ratio(gradients["post"])
        assert post > pre, (seed, gradients)
        assert abs(post - 1) <= logic.LEVEL and pre < 1 - logic.LEVEL, (seed, gradients)
        assert "this model does not show that at initialisation" in logic.init_words(gradients)


def tiny_text() -> npl.TrainingText:
    generator = torch.Generator().manual_seed(0)
    return npl.TrainingText(torch.randint(0, SMALL.vocab_size, (400,), generator=generator),
                            torch.randint(0, SMALL.vocab_size, (100,), generator=generator), "random tokens")


TINY = npl.Settings(learning_rate=1e-2, steps=5, warmup=2, batch=2, length=8, held_out_windows=2, shape=SMALL)


def test_experiment_records_every_step_deterministically():
    shares = []
    result = npl.experiment(TINY, tiny_text(), progress=lambda share, what: shares.append(share))
    again = npl.experiment(TINY, tiny_text())
    assert [(run.norm, run.warmup) for run in result.runs] == [("pre", 0), ("pre", 2), ("post", 0), ("post", 2)]
    for run, other in zip(result.runs, again.runs, strict=True):
        assert len(run.losses) == len(run.learning_rates) == len(run.grad_norms) == 5
        assert all(len(norms) == SMALL.n_layer for norms in run.grad_norms)
        assert sorted(run.held_out) == [0, 1, 2, 3, 4, 5] and run.diverged_at is None
        assert run.losses == other.losses and run.grad_norms == other.grad_norms and run.held_out == other.held_out
        assert run.learning_rates == [npl.learning_rate(step, 1e-2, run.warmup, 5) for step in range(5)]
    assert result.init_gradients == again.init_gradients
    # step 0's gradients are the gradients at initialisation (the same weights, the same first batch)
    assert result.run("post", False).grad_norms[0] == pytest.approx(result.init_gradients["post"], rel=1e-5)
    assert shares == sorted(shares) and shares[-1] == pytest.approx(1.0)
    with pytest.raises(npl.Stopped):
        npl.experiment(TINY, tiny_text(), cancel=lambda: True)


def test_a_run_whose_loss_is_not_finite_stops_and_says_so():
    run = npl.train_run(replace(TINY, learning_rate=float("inf")), tiny_text(), "post", 0)
    assert run.diverged_at == 1 and len(run.losses) == 2 and not math.isfinite(run.losses[-1])


def constructed(finals: dict[tuple[str, int], float], diverged: dict[tuple[str, int], int] | None = None,
                ratios: dict[str, float] | None = None) -> npl.Result:
    """A result with the given final held-out losses (and divergences, and last-to-first gradient ratios)."""
    runs = []
    for (norm, warmup), final in finals.items():
        r = (ratios or {}).get(norm, 1.0)
        runs.append(npl.Run(norm, warmup, losses=[8.0, 7.0, final], grad_norms=[[1.0, r]] * 3,
                            learning_rates=[1e-3] * 3, held_out={0: 8.3, 3: final},
                            diverged_at=(diverged or {}).get((norm, warmup))))
    return npl.Result(npl.Settings(steps=3, warmup=2), {"pre": [1.0, 1.0], "post": [1.0, 1.0]}, runs, 1.0, 2, "text")


def test_init_words_follow_the_numbers():
    textbook = logic.init_words({"pre": [1.0, 1.02, 1.04], "post": [0.1, 0.2, 0.4]})
    assert "(4×): it grows towards the output" in textbook and "this model shows the same" in textbook
    assert "ratio is higher than pre-norm's (4× against 1.04×)" in textbook
    level = logic.init_words({"pre": [1.81, 1.42, 1.18], "post": [0.0571, 0.0569, 0.057]})
    assert "pre-norm's gradient norm goes from 1.81 at block 0 to 1.18 at block 2 (0.652×): it falls" in level
    assert ("post-norm's gradient norm goes from 0.0571 at block 0 to 0.057 at block 2 (0.998×): it is level, "
            "within 10%") in level
    assert "does not show that at initialisation" in level
    assert "pre-norm's gradients are 20.7× to 31.7× post-norm's" in level
    partial = logic.init_words({"pre": [2.0, 1.0], "post": [1.0, 3.0]})
    assert "shows the first, but its pre-norm's falls towards the output" in partial
    assert "ratio is not higher than" in logic.init_words({"pre": [1.0, 3.0], "post": [1.0, 2.0]})


def test_loss_and_warmup_words_follow_the_numbers():
    worse = constructed({("pre", 0): 6.04, ("pre", 2): 6.12, ("post", 0): 6.35, ("post", 2): 6.33})
    said = logic.loss_words(worse)
    assert "post-norm did not diverge at this learning rate; it ends worse than pre-norm, by 0.31 nats" in said
    assert "post-norm, no warm-up: 6.35" in said and "8.3 at step 0" in said
    warm = logic.warmup_words(worse)
    assert "Warm-up (2 of the 3 steps)" in warm
    assert "Pre-norm: warm-up raises its final held-out loss by 0.08 nats (6.04 → 6.12)" in warm
    assert "Post-norm: warm-up changes its final held-out loss by less than 0.05 nats (6.35 → 6.33)" in warm
    same = constructed({("pre", 0): 6.0, ("pre", 2): 5.5, ("post", 0): 6.02, ("post", 2): 5.6})
    assert "it ends where pre-norm does (within 0.05 nats: 0.02)" in logic.loss_words(same)
    assert "Pre-norm: warm-up lowers its final held-out loss by 0.5 nats" in logic.warmup_words(same)
    better = constructed({("pre", 0): 6.4, ("pre", 2): 6.0, ("post", 0): 6.0, ("post", 2): 6.0})
    assert "it ends better than pre-norm, by 0.4 nats" in logic.loss_words(better)
    diverged = constructed({("pre", 0): 6.0, ("pre", 2): 6.0, ("post", 0): float("nan"), ("post", 2): 6.1},
                           diverged={("post", 0): 7})
    said = logic.loss_words(diverged)
    assert "post-norm diverged at step 7 and pre-norm did not" in said
    assert "post-norm, no warm-up: diverged at step 7 (its loss was no longer finite)" in said
    assert "Post-norm: without warm-up diverged at step 7" in logic.warmup_words(diverged)


def test_early_words_follow_the_numbers():
    apart = constructed({("pre", 0): 6.0, ("pre", 2): 6.0, ("post", 0): 6.3, ("post", 2): 6.3},
                        ratios={"pre": 0.8, "post": 15300.0})
    said = logic.early_words(apart)
    assert "Over steps 2-2" in said and "post-norm, no warm-up 15,300×" in said and "pre-norm, no warm-up 0.8×" in said
    assert "the last block getting more than 10× the first's: the first blocks of post-norm get little" in said
    assert "block 0's is 1 at step 0, a median 1 over steps 2-2" in said
    near = constructed({("pre", 0): 6.0, ("pre", 2): 6.0, ("post", 0): 6.3, ("post", 2): 6.3},
                       ratios={"pre": 0.8, "post": 2.0})
    assert logic.early_words(near).endswith("more concentrated near the output than in either pre-norm run.")
    alike = constructed({("pre", 0): 6.0, ("pre", 2): 6.0, ("post", 0): 6.3, ("post", 2): 6.3},
                        ratios={"pre": 1.0, "post": 1.0})
    assert "not more concentrated near the output than pre-norm's in every run" in logic.early_words(alike)


def test_figures_put_step_zero_on_the_log_axis_and_say_where():
    result = constructed({("pre", 0): 6.0, ("pre", 2): 6.1, ("post", 0): 6.3, ("post", 2): 6.2})
    losses = figures.loss_curves_figure(logic.loss_runs(result))
    assert losses.layout.xaxis.type == "log" and "step 0 drawn at 0.5" in losses.layout.xaxis.title.text
    assert losses.layout.xaxis.ticktext[0] == "0" and losses.layout.xaxis.tickvals[0] == 0.5
    held_out = [trace for trace in losses.data if trace.mode == "lines+markers"]
    assert len(held_out) == 4 and list(held_out[0].x) == [0.5, 3.0] and list(held_out[0].customdata) == [0, 3]
    assert {trace.line.dash for trace in held_out} == {"solid", "dash"}
    gradients = figures.gradients_over_steps_figure({run.name: run.grad_norms for run in result.runs})
    assert len(gradients.data) == 4 * 2 and gradients.layout.yaxis.type == "log"
    init = figures.init_gradient_figure({"pre": [2.0, 1.0], "post": [1.0, 1.0]}, npl.NORM_NAMES)
    assert init.layout.yaxis.type == "log" and [trace.name for trace in init.data] == ["pre-norm", "post-norm"]
    assert figures.running_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def _section(base):
    from attnviz.ui.norm_placement_view import norm_placement_section

    norm_placement_section(base)


def test_section_draws_the_gradients_at_once_and_trains_only_when_asked(clean_streamlit_caches):
    at = AppTest.from_function(_section, kwargs={"base": None}, default_timeout=120)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    init = figure_titled(at, "Each block's gradient norm at initialisation")
    assert [trace["name"] for trace in init["data"]] == ["pre-norm", "post-norm"]
    assert any("Press the button" in info.value for info in at.info)
    assert any("does not show that at initialisation" in text.value for text in at.markdown)
    assert len(at.get("plotly_chart")) == 1  # nothing trained


def _train_pressed() -> AppTest:
    """The section on a tiny shape, set to 5 steps a run, after a click on "Train both ways"."""
    base = npl.Settings(batch=2, length=16, held_out_windows=2,
                        shape=npl.Shape(context=16, n_layer=2, n_head=2, d_model=16, d_mlp=32))
    at = AppTest.from_function(_section, kwargs={"base": base}, default_timeout=120)
    at.run()
    at.number_input(key="np_steps").set_value(5)
    at.run()
    at.button(key="np_train").click()
    at.run()
    return at


def test_section_trains_a_tiny_run_when_the_button_is_pressed(clean_streamlit_caches):
    at = _train_pressed()
    assert not at.exception, [e.value for e in at.exception]
    losses = figure_titled(at, "Loss of the four runs")
    assert len([trace for trace in losses["data"] if trace["mode"] == "lines+markers"]) == 4
    figure_titled(at, "Each block's gradient norm over the first steps")
    words = " ".join(text.value for text in at.markdown)
    assert "Held-out loss at the end" in words and "Warm-up (5 of the 5 steps)" in words
    assert not [button for button in at.button if button.key in ("np_stop", "np_train")]  # their place emptied
    at.run()  # a rerun reads the kept result: no button to press again
    assert not at.exception and len(at.get("plotly_chart")) == 3


def test_a_second_session_training_at_once_is_told_to_wait(clean_streamlit_caches):
    from attnviz.ui import norm_placement_view as view

    slots = view._training_slots()
    assert view.training_limit() == 1
    assert slots.acquire(blocking=False)  # another session's runs hold the server's one slot
    try:
        at = _train_pressed()
        assert not at.exception, [e.value for e in at.exception]
        assert any("Another session is training these runs" in warning.value for warning in at.warning)
        assert len(at.get("plotly_chart")) == 1  # nothing trained
    finally:
        slots.release()
    at.button(key="np_retry").click()
    at.run()  # the slot is free again: it trains
    assert not at.exception and len(at.get("plotly_chart")) == 3
    assert slots.acquire(blocking=False)  # and gave its slot back
    slots.release()
