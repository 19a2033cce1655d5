"""Head importance: ablation maps, gradient importance, their rank agreement, per-token effects, activation
patching, and the bundled tiny GPT's induction circuit, measured on the model."""

import pytest
import torch
import transformers as T
from scipy.stats import spearmanr

from attnviz.core import circuits
from attnviz.interventions import edits as iv
from attnviz.interventions import importance as imp
from attnviz.interventions import importance_ranks as ranking
from attnviz.interventions import induction_circuit as ind
from attnviz.models.shipped import BUNDLED_GPT_DIR
from attnviz.models.with_heads import load_causal_lm
from tests.tiny_models import TINY_GPT_HEADS, TINY_GPT_LAYERS

SENTENCES = ["The cat sat on the mat because it was warm.", "Attention heads read keys.",
             "A longer sentence, with a comma, and more words to read than the others have."]


@pytest.fixture(scope="module")
def tiny_gpt():
    model, tokenizer = iv.editable_lm(BUNDLED_GPT_DIR)
    return model, tokenizer


def test_the_bundled_gpt_loads_editable_and_its_objective_is_next_token(tiny_gpt):
    model, _ = tiny_gpt
    assert iv.editable(model) is None
    assert imp.objective_of(model) == "next-token"
    eager, _ = load_causal_lm(BUNDLED_GPT_DIR)
    assert "not through attnviz's attention function" in iv.editable(eager)


def test_a_map_of_a_batch_is_the_mean_of_each_texts_own_map(tiny_gpt):
    """Padding does not leak: each text's row of the batched map equals the map of that text alone."""
    model, tokenizer = tiny_gpt
    batch = imp.batch_of(tokenizer, SENTENCES, "next-token")
    assert batch.real.sum(-1).tolist() == [len(tokenizer(text)["input_ids"]) for text in SENTENCES]
    together = imp.ablation_map(model, batch, "zero")
    assert together.values.shape == (TINY_GPT_LAYERS, TINY_GPT_HEADS)
    assert together.per_text.shape == (TINY_GPT_LAYERS, TINY_GPT_HEADS, 3)
    for index, text in enumerate(SENTENCES):
        alone = imp.ablation_map(model, imp.batch_of(tokenizer, [text], "next-token"), "zero")
        assert torch.allclose(together.per_text[..., index], alone.values, atol=1e-4)
    assert torch.allclose(together.values, together.per_text.mean(-1))
    assert together.clean > 0 and together.values.abs().max() > 0.01  # ablating some head changes the loss


def test_mean_ablation_replaces_a_head_by_its_mean_over_the_real_tokens(tiny_gpt):
    model, tokenizer = tiny_gpt
    batch = imp.batch_of(tokenizer, SENTENCES, "next-token")
    zero, mean = imp.ablation_map(model, batch, "zero"), imp.ablation_map(model, batch, "mean")
    assert not torch.allclose(zero.values, mean.values)
    # the mean the head is replaced by is its output averaged over every real token of every text
    recorded, _ = iv.head_outputs(model, batch.inputs)
    name = zero.modules[0].name
    tokens = recorded[name][batch.real]  # [real tokens, heads, d_v]
    assert torch.allclose(iv.mean_over_tokens(recorded[name], batch.real), tokens.mean(0), atol=1e-6)
    with pytest.raises(ValueError, match="unknown ablation"):
        imp.ablation_map(model, batch, "noise")


def test_an_encoder_without_a_head_measures_its_hidden_states_and_refuses_gradients():
    model = T.BertModel(T.BertConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                                     intermediate_size=64, vocab_size=100)).eval()
    model.set_attn_implementation(iv.ATTENTION_NAME)
    assert imp.objective_of(model) == "hidden"
    ids = torch.randint(1, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    batch = imp.Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, torch.ones(2, 9, dtype=torch.bool),
                      [["x"] * 9] * 2, ["a", "b"], [False, False])
    result = imp.ablation_map(model, batch, "zero")
    assert result.clean == 0.0 and (result.values > 0).all()  # a distance from the clean states: positive
    with pytest.raises(ValueError, match="needs a loss"):
        imp.gradient_importance(model, batch)


def test_the_mean_map_equals_each_text_run_alone_with_the_mean_over_every_texts_tokens(tiny_gpt):
    """Independent of padding: the reference runs each text alone (no padding), takes each head's mean output over
    every token of every text, and measures each text's next-token loss with the head replaced by it."""
    model, tokenizer = tiny_gpt
    model = model.double()
    try:
        batch = imp.batch_of(tokenizer, SENTENCES, "next-token")
        result = imp.ablation_map(model, batch, "mean")
        alone = [torch.tensor([tokenizer(text)["input_ids"]]) for text in SENTENCES]
        outputs = [iv.head_outputs(model, {"input_ids": ids})[0] for ids in alone]

        def loss(ids: torch.Tensor, plan: dict) -> float:
            with torch.no_grad(), iv.edited(model, plan):
                logits = model(input_ids=ids).logits[0, :-1]
            return float(torch.nn.functional.cross_entropy(logits, ids[0, 1:]))

        for row, module in enumerate(result.modules):
            every_token = torch.cat([kept[module.name][0] for kept in outputs])  # [all tokens, heads, d_v]
            for head in (0, module.heads - 1):
                mean = every_token[:, head].mean(0)
                for index, ids in enumerate(alone):
                    expected = loss(ids, {module.name: {head: mean}}) - loss(ids, {})
                    # (the map keeps float32 numbers)
                    assert float(result.per_text[row, head, index]) == pytest.approx(expected, rel=1e-6, abs=1e-7)
    finally:
        model.float()


def test_the_measures_are_compared_by_the_size_of_each_effect_either_way():
    """Removing a head can lower the loss (a negative change): it matters as much as one that raises it by as much,
    and gradient importance is a size already (|dL/dg|)."""
    modules = [iv.AttentionModule("a", 3, "self", 0), iv.AttentionModule("b", 3, "self", 1)]
    ablation = imp.ImportanceMap("zero", torch.tensor([[-6.0, 1.0, 2.0], [3.0, -0.5, 0.1]]), modules,
                                 "next-token", 1.0)
    gradient = imp.ImportanceMap("gradient", torch.tensor([[6.0, 1.0, 2.0], [3.0, 0.5, 0.1]]), modules,
                                 "next-token", 1.0)
    assert ranking.agreement({"zero": ablation, "gradient": gradient})[0][2] == pytest.approx(1.0)
    assert all(row["rank gap"] == 0 for row in ranking.disagreements(ablation, gradient))
    study = imp.Study(None, "next-token", modules, {"zero": ablation, "gradient": gradient})
    rows = ranking.head_rows(study)
    assert rows[0]["head"] == "layer 0, head 0" and rows[0]["rank (zero)"] == 1 and rows[0]["zero"] == -6.0


def test_spearman_agrees_with_scipy_with_ties_and_missing_heads():
    first = torch.tensor([[0.1, 0.5, 0.5, float("nan")], [0.9, -0.2, 0.3, 0.0]])
    second = torch.tensor([[0.2, 0.1, 0.7, 0.4], [0.8, 0.0, 0.3, 0.3]])
    keep = ~first.isnan()
    expected = spearmanr(first[keep].numpy(), second[keep].numpy()).statistic
    assert ranking.spearman(first, second) == pytest.approx(expected, abs=1e-12)
    assert ranking.spearman(second, second) == pytest.approx(1.0)
    assert ranking.spearman(second, -second) == pytest.approx(-1.0)


def test_disagreements_name_the_heads_ranked_furthest_apart():
    modules = [iv.AttentionModule("a", 3, "self", 0), iv.AttentionModule("b", 3, "self", 1)]
    first = imp.ImportanceMap("zero", torch.tensor([[6.0, 5.0, 4.0], [3.0, 2.0, 1.0]]), modules, "next-token", 1.0)
    second = imp.ImportanceMap("gradient", torch.tensor([[6.0, 5.0, 4.0], [3.0, 2.0, 7.0]]), modules, "next-token",
                               1.0)
    top = ranking.disagreements(first, second, count=1)[0]
    assert top["head"] == "layer 1, head 2" and top["zero"] == 6 and top["gradient"] == 1 and top["rank gap"] == 5


def test_the_token_effect_of_a_head_adds_up_to_its_map_cell(tiny_gpt):
    model, tokenizer = tiny_gpt
    batch = imp.batch_of(tokenizer, SENTENCES[:1], "next-token")
    result = imp.ablation_map(model, batch, "zero")
    module = result.modules[1]
    targets, change = imp.token_effect(model, batch, module, 2)
    assert len(targets) == len(change) == len(batch.tokens[0]) - 1
    assert targets == batch.tokens[0][1:]  # each change is the loss of predicting that token
    assert float(change.mean()) == pytest.approx(float(result.values[1, 2]), abs=1e-5)


@pytest.mark.parametrize("how", ["zero", "mean"])
def test_one_texts_token_effect_equals_the_whole_batch_run_with_the_head_ablated(tiny_gpt, how):
    """token_effect runs only the chosen text again (with the batch's clean run, and its means for mean ablation):
    the same changes as ablating the head over the whole batch and reading that text's row."""
    model, tokenizer = tiny_gpt
    batch = imp.batch_of(tokenizer, SENTENCES[:3], "next-token")
    module = imp.attention_modules(model, batch.inputs)[2]
    clean = imp.clean_run(model, batch, "next-token")
    means, _, clean_losses, counted = clean
    plan = imp.zeroed(module.name, 1) if how == "zero" else {module.name: {1: means[module.name][1]}}
    with torch.no_grad(), imp.edited(model, plan):
        losses, _ = imp.token_losses(model, batch, model(**batch.inputs), "next-token")
    for text in range(3):
        targets, change = imp.token_effect(model, batch, module, 1, how, text, clean=clean)
        expected = (losses - clean_losses)[text][counted[text]]
        torch.testing.assert_close(change, expected, atol=1e-5, rtol=1e-5)
        assert len(targets) == len(expected) > 0


def test_the_induction_circuit_of_the_bundled_gpt(tiny_gpt):
    """Ablating each strong induction head (the heads that put more than 0.6 of their weight on the token after
    the current one's earlier copy) raises the second copy's loss at least 2x while the first copy's moves by less
    than 10%; ablating the previous-token head breaks induction too, more than any single induction head: the heads
    compose. (A weaker one, layer 1's head 3 at 0.51, shares the work: alone it costs 1.5x.)"""
    model, tokenizer = tiny_gpt
    pool = circuits.ordinary_token_ids(tokenizer)
    bos = tokenizer.bos_token_id  # as the page and the training runs read the model: after a BOS
    result = ind.induction_circuit(model, pool, period=50, texts=8, seed=11, bos=bos)
    assert result.clean_second < 0.25 * result.clean_first  # the model copies: the second copy is easy
    scores = ind.circuit_scores(model, pool, period=50, seed=11, bos=bos)
    heads = [(layer, head) for layer in range(TINY_GPT_LAYERS) for head in range(TINY_GPT_HEADS)]
    induction = [(layer, head) for layer, head in heads if scores["induction"][layer, head] > 0.6]
    previous = [(layer, head) for layer, head in heads if scores["previous"][layer, head] > 0.5]
    # one previous-token head, in layer 0; the induction heads after it
    assert len(induction) >= 1 and len(previous) == 1 and previous[0][0] == 0
    assert all(layer >= 1 for layer, _ in induction)
    for layer, head in induction:
        assert result.second[layer, head] >= 2 * result.clean_second, (layer, head)
        assert abs(result.first[layer, head] - result.clean_first) < 0.1 * result.clean_first, (layer, head)
    layer, head = previous[0]
    assert result.second[layer, head] > max(float(result.second[i, h]) for i, h in induction)
    assert result.second[layer, head] >= 5 * result.clean_second


def test_the_repeats_start_with_the_bos_and_no_token_repeats_inside_a_copy():
    ids = ind.repeats(list(range(10, 70)), 50, 4, seed=3, bos=0)
    assert ids.shape == (4, 101) and (ids[:, 0] == 0).all()
    assert torch.equal(ids[:, 1:51], ids[:, 51:])
    assert all(len(set(row[1:51].tolist())) == 50 for row in ids)
    assert ind.repeats(list(range(10, 70)), 50, 2, seed=3).shape == (2, 100)  # no BOS: none put in
    assert ind.repeats(list(range(5)), 8, 1, seed=3).shape == (1, 16)  # a pool smaller than a copy: drawn again


def _circuit(first: list[list[float]], second: list[list[float]], clean_first: float, clean_second: float):
    modules = [iv.AttentionModule("a", 2, "self", 0), iv.AttentionModule("b", 2, "self", 1)]
    return ind.Circuit(torch.tensor(first), torch.tensor(second), clean_first, clean_second, modules)


def test_the_circuit_story_claims_only_what_the_numbers_show():
    scores = {"previous": torch.tensor([[0.1, 0.9], [0.0, 0.0]]), "induction": torch.tensor([[0.0, 0.0],
                                                                                             [0.1, 0.8]])}
    falls = torch.tensor([[0.0, 0.0], [0.05, 0.1]])  # L1 H1's induction score with L0 H1 zeroed
    copies = _circuit([[6.0, 6.0], [6.0, 6.1]], [[3.0, 0.6], [0.5, 2.0]], 6.0, 0.5)
    told = ind.story(copies, scores, 50, composed=falls, bos="<|endoftext|>")
    assert "it copies" in told and "**L1 H1**" in told and "**4.0x**" in told and "**1.2x**" in told
    assert "after the BOS token `<|endoftext|>`" in told and "nats per token" in told
    assert "do not need it" in told and "compose" not in told  # L0 H1 removed costs 1.2x: no composition shown
    composed = _circuit([[6.0, 6.0], [6.0, 6.1]], [[3.0, 4.0], [0.5, 2.0]], 6.0, 0.5)
    told = ind.story(composed, scores, 50, composed=falls)
    assert "the heads compose" in told and "**L1 H1** 0.80 → 0.10" in told and "with no BOS token" in told
    # six of twelve heads of the tiny GPT raise the second copy's loss 1.5x: that alone is not composition
    assert "compose" not in ind.story(composed, scores, 50)  # where the induction heads look without it: unmeasured
    assert "not measured" in ind.story(composed, scores, 50)
    stays = torch.tensor([[0.0, 0.0], [0.05, 0.75]])
    told = ind.story(composed, scores, 50, composed=stays)
    assert "compose" not in told and "still attend" in told
    other_work = _circuit([[6.0, 7.2], [6.0, 6.1]], [[3.0, 4.0], [0.5, 2.0]], 6.0, 0.5)  # the first copy +20%
    told = ind.story(other_work, scores, 50, composed=falls)
    assert "compose" not in told and "does other work too" in told
    # the previous-token head must sit in an earlier layer than the induction head it feeds
    later = {"previous": torch.tensor([[0.1, 0.1], [0.95, 0.0]]), "induction": scores["induction"]}
    told = ind.story(composed, later, 50, composed=falls)
    assert "No head in an earlier layer attends to the previous token" in told and "compose" not in told
    no_copy = _circuit([[6.0, 6.0], [6.0, 6.0]], [[6.0, 6.0], [6.0, 6.0]], 6.0, 5.5)
    told = ind.story(no_copy, scores, 50)
    assert "does not copy" in told and "Zeroing" not in told
    nothing_inducts = {"previous": scores["previous"], "induction": torch.full((2, 2), 0.1)}
    assert "no head attends like an induction head" in ind.story(composed, nothing_inducts, 50)
    unneeded = _circuit([[6.0, 6.0], [6.0, 6.0]], [[3.0, 4.0], [0.5, 0.6]], 6.0, 0.5)
    assert "the model copies without it" in ind.story(unneeded, scores, 50)


def _induction_scores_by_hand(eager, ids: torch.Tensor, period: int, start: int, zero: tuple[int, int]):
    """Every head's mean weight from each second-copy query to the token after its first
    occurrence, on transformers' eager GPT-2 with one head's columns of its output projection's input zeroed by a
    pre-hook: ``[layers, heads]``."""
    layer, head = zero
    attention = eager.transformer.h[layer].attn
    width = eager.config.n_embd // eager.config.n_head

    def hook(_, args):
        merged = args[0].clone()
        merged[..., head * width:(head + 1) * width] = 0
        return (merged, *args[1:])

    handle = attention.c_proj.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            weights = torch.stack(eager(input_ids=ids, output_attentions=True).attentions, 1)  # [b, L, H, n, n]
    finally:
        handle.remove()
    queries = torch.arange(start + period, start + 2 * period)
    keys = queries - period + 1  # the token after the query's earlier occurrence
    return weights[..., queries, keys].mean(dim=(0, -1))


def test_the_tiny_gpts_heads_compose_by_the_test_that_shows_it(tiny_gpt):
    """At the page's own setting (50 tokens twice, 8 sequences, seed 11, after the BOS): zeroing the previous-token
    head L0 H1 leaves the first copy alone, makes the second copy far harder, and takes the induction heads'
    attention away (checked on transformers' eager GPT-2 with the head zeroed by hand); another early head that
    costs the second copy as much (L0 H2, 3.3x) leaves their attention where it was."""
    model, tokenizer = tiny_gpt
    pool = circuits.ordinary_token_ids(tokenizer)
    bos = tokenizer.bos_token_id
    result = ind.induction_circuit(model, pool, period=50, texts=8, seed=11, bos=bos)
    scores = ind.circuit_scores(model, pool, period=50, seed=11, bos=bos)
    assert ind.feeder(result, scores) == 1  # L0 H1
    composed = ind.without_feeder(model, pool, result, scores, period=50, seed=11, bos=bos)
    eager, _ = load_causal_lm(BUNDLED_GPT_DIR)
    ids = ind.repeats(pool, 50, 8, 11, bos)
    by_hand = _induction_scores_by_hand(eager, ids, 50, 1, (0, 1))
    torch.testing.assert_close(composed, by_hand, atol=1e-5, rtol=1e-4)
    told = ind.story(result, scores, 50, composed=composed, bos=tokenizer.bos_token)
    assert "the heads compose" in told
    assert abs(float(result.first[0, 1]) / result.clean_first - 1) < ind.ALONE
    for layer, head in ((2, 1), (2, 2), (1, 3)):  # every head that attends like an induction head is named
        assert f"**L{layer} H{head}** {float(scores['induction'][layer, head]):.2f} → " in told
        assert composed[layer, head] <= ind.READS * scores["induction"][layer, head]
    # the other early head whose removal costs the second copy 1.5x or more does not take their attention away
    assert float(result.second[0, 2]) >= ind.MATTERS * result.clean_second
    other = _induction_scores_by_hand(eager, ids, 50, 1, (0, 2))
    assert (other[2, 1:3] > ind.READS * scores["induction"][2, 1:3]).all()


def test_the_head_table_ranks_every_head_by_each_measure():
    modules = [iv.AttentionModule("a", 2, "self", 0), iv.AttentionModule("b", 2, "self", 1)]
    result = imp.Study(batch=None, objective="next-token", modules=modules)
    result.maps["zero"] = imp.ImportanceMap("zero", torch.tensor([[0.1, 0.4], [0.3, -0.2]]), modules, "next-token", 1)
    result.maps["gradient"] = imp.ImportanceMap("gradient", torch.tensor([[0.9, 0.1], [0.2, 0.3]]), modules,
                                                "next-token", 1)
    rows = ranking.head_rows(result, {("self", 0, 1): "previous token"})
    # by the size of the effect: removing layer 1's head 1 lowers the loss by 0.2, more than layer 0's head 0 moves it
    assert [row["head"] for row in rows] == ["layer 0, head 1", "layer 1, head 0", "layer 1, head 1",
                                             "layer 0, head 0"]
    assert rows[0]["label"] == "previous token" and rows[1]["label"] == ""
    assert [row["rank (gradient)"] for row in rows] == [4, 3, 2, 1]
    rows = ranking.head_rows(result, statistics={("self", 1, 1): {"previous token": 0.9}})
    assert next(row for row in rows if row["head"] == "layer 1, head 1")["previous token"] == 0.9


def test_a_stopped_map_goes_on_where_it_stopped_and_gives_the_same_map(tiny_gpt):
    model, tokenizer = tiny_gpt
    batch = imp.batch_of(tokenizer, SENTENCES, "next-token")
    whole = imp.ablation_map(model, batch, "mean")
    finished, seen = {}, []

    def stop_after_three(share, what):
        seen.append(what)
        if len(seen) == 3:
            raise KeyboardInterrupt("the page was rerun")

    with pytest.raises(KeyboardInterrupt):
        imp.ablation_map(model, batch, "mean", progress=stop_after_three, finished=finished)
    assert len(finished) == 3
    again = []
    resumed = imp.ablation_map(model, batch, "mean", progress=lambda share, what: again.append(share),
                               finished=finished)
    total = TINY_GPT_LAYERS * TINY_GPT_HEADS
    assert len(again) == total - 3 and again[0] == 4 / total and again[-1] == 1.0  # only the heads left were run
    assert torch.allclose(resumed.values, whole.values, atol=1e-6)


def test_a_text_with_nothing_to_predict_is_left_out_of_the_means(tiny_gpt):
    model, tokenizer = tiny_gpt
    one_token = next(word for word in ("a", "I", "x") if len(tokenizer(word)["input_ids"]) == 1)
    alone = imp.ablation_map(model, imp.batch_of(tokenizer, SENTENCES[:2], "next-token"), "zero")
    both = imp.ablation_map(model, imp.batch_of(tokenizer, [*SENTENCES[:2], one_token], "next-token"), "zero")
    assert both.clean == pytest.approx(alone.clean, abs=1e-5)
    assert torch.allclose(both.values, alone.values, atol=1e-5)
    gradient_alone = imp.gradient_importance(model, imp.batch_of(tokenizer, SENTENCES[:2], "next-token"))
    gradient_both = imp.gradient_importance(model, imp.batch_of(tokenizer, [*SENTENCES[:2], one_token],
                                                                "next-token"))
    assert torch.allclose(gradient_both.values, gradient_alone.values, atol=1e-5)
    with pytest.raises(ValueError, match="no text has a token to predict"):
        imp.ablation_map(model, imp.batch_of(tokenizer, [one_token], "next-token"), "zero")


def test_marian_style_encoder_decoders_are_measured_by_their_loss():
    model = T.MarianMTModel(T.MarianConfig(vocab_size=60, d_model=16, encoder_layers=1, decoder_layers=1,
                                           encoder_attention_heads=2, decoder_attention_heads=2,
                                           encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
                                           decoder_start_token_id=59, pad_token_id=59)).eval()
    model.set_attn_implementation(iv.ATTENTION_NAME)
    assert imp.objective_of(model) == "seq2seq"
    assert imp.objective_of(T.BertForMaskedLM(T.BertConfig(hidden_size=16, num_attention_heads=2,
                                                           num_hidden_layers=1, intermediate_size=32,
                                                           vocab_size=60))) == "masked"
    assert imp.objective_of(T.BertForPreTraining(T.BertConfig(hidden_size=16, num_attention_heads=2,
                                                              num_hidden_layers=1, intermediate_size=32,
                                                              vocab_size=60))) == "hidden"
