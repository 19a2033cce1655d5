"""Direct logit attribution and the logit lens against hand-written hooks on transformers' eager models (a separate
copy, not attnviz's attention function): on the bundled tiny GPT-2 (where layer 2's induction heads carry the
induction prompt's answer), a tiny Llama (grouped-query attention, RoPE, RMSNorm with random gains), and a tiny BERT
masked LM (its lens through the whole ``cls`` head; its attribution carried forward through its frozen norms by hand),
with RoBERTa, DistilBERT and ELECTRA adding up too. Every model in float64, so that the references agree in rounding,
not by luck."""

import copy
from types import SimpleNamespace

import plotly.graph_objects as go
import pytest
import torch
import transformers as T

from attnviz.core import circuits
from attnviz.interventions import activation_patching as ap
from attnviz.interventions import edits as iv
from attnviz.interventions import induction_circuit as ind
from attnviz.interventions import logit_attribution as la
from attnviz.interventions import patching as patch
from attnviz.interventions.anatomy import NotReadable
from attnviz.models.shipped import BUNDLED_GPT_DIR
from attnviz.models.with_heads import load_causal_lm
from attnviz.viz import logit_attribution as figures
from tests.tiny_models import TINY_GPT_LAYERS

# -- the models ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt():
    model, tokenizer = iv.editable_lm(BUNDLED_GPT_DIR)
    eager, _ = load_causal_lm(BUNDLED_GPT_DIR)
    assert eager.config._attn_implementation == "eager"
    prompts = patch.induction_prompts(circuits.ordinary_token_ids(tokenizer), 30, seed=5, bos=0)
    return SimpleNamespace(model=model.eval().double(), eager=eager.eval().double(), tokenizer=tokenizer,
                           ids=prompts.clean, answer=prompts.answer, foil=prompts.foil, spec=GPT2)


def _pair(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """attnviz's copy (its attention function) and transformers' eager copy of the same weights, in float64."""
    model.eval().double()
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    model.set_attn_implementation(iv.ATTENTION_NAME)
    return model, eager


def _ids(seed: int, n: int = 14, vocab: int = 120) -> list[int]:
    return torch.randint(1, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                             num_hidden_layers=3, intermediate_size=128, vocab_size=120,
                                             max_position_embeddings=64, initializer_range=0.1))
    with torch.no_grad():
        for module in model.modules():  # gains far from 1, so a gain the attribution forgot would show
            if type(module).__name__ == "LlamaRMSNorm":
                module.weight.copy_(1 + 0.5 * torch.randn_like(module.weight))
    model, eager = _pair(model)
    return SimpleNamespace(model=model, eager=eager, ids=_ids(1), answer=7, foil=11, spec=LLAMA)


def _random_norms_and_biases(model: torch.nn.Module) -> torch.nn.Module:
    """Every LayerNorm's gain and bias and every linear layer's bias drawn at random (initialisation makes them 1
    and 0, which a reference that forgot them would pass)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(1 + 0.5 * torch.randn_like(module.weight))
                module.bias.copy_(0.2 * torch.randn_like(module.bias))
            elif isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.copy_(0.2 * torch.randn_like(module.bias))
    return model


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    model, eager = _pair(_random_norms_and_biases(T.BertForMaskedLM(T.BertConfig(
        hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, vocab_size=120))))
    return SimpleNamespace(model=model, eager=eager, ids=_ids(2), answer=7, foil=11)


@pytest.fixture(params=["gpt", "llama"])
def decoder(request):
    return request.getfixturevalue(request.param)


# -- the reference: hand-written hooks on the eager copy ------------------------------------------------------------
GPT2 = SimpleNamespace(
    blocks=lambda m: m.transformer.h, projection=lambda b: b.attn.c_proj, mlp=lambda b: b.mlp,
    norm=lambda m: m.transformer.ln_f, eps=lambda c: c.layer_norm_epsilon, centres=True,
    weight_in_out=True,  # Conv1D: weight [in, out]
    embeddings=lambda m, ids: m.transformer.wte.weight[ids] + m.transformer.wpe.weight[: len(ids)],
    heads=lambda c: c.n_head,
)
LLAMA = SimpleNamespace(
    blocks=lambda m: m.model.layers, projection=lambda b: b.self_attn.o_proj, mlp=lambda b: b.mlp,
    norm=lambda m: m.model.norm, eps=lambda c: c.rms_norm_eps, centres=False,
    weight_in_out=False,  # Linear: weight [out, in]
    embeddings=lambda m, ids: m.model.embed_tokens.weight[ids],
    heads=lambda c: c.num_attention_heads,
)


def reference_parts(eager, spec, ids: list[int], answer: int,
                    foil: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Each part's share of logit(answer) - logit(foil) at every position, by hand: the output projection's input
    (a pre-hook) split into heads and multiplied by the head's slice of the projection's weight, the MLPs' outputs
    (hooks), the embeddings from the embedding tables, the final norm's scale from its input (a pre-hook: the last
    of ``output_hidden_states`` is after the final norm), all read through the norm's gain and the unembedding rows.
    Also the eager model's own logit difference ``[n]``."""
    kept, handles = {}, []
    blocks, norm = spec.blocks(eager), spec.norm(eager)
    for layer, block in enumerate(blocks):
        handles.append(spec.projection(block).register_forward_pre_hook(
            lambda _, args, layer=layer: kept.__setitem__(("z", layer), args[0][0].double())))
        handles.append(spec.mlp(block).register_forward_hook(
            lambda _, __, out, layer=layer: kept.__setitem__(("mlp", layer), out[0].double())))
    handles.append(norm.register_forward_pre_hook(lambda _, args: kept.__setitem__("final", args[0][0].double())))
    try:
        with torch.no_grad():
            logits = eager(input_ids=torch.tensor([ids])).logits[0].double()  # [n, vocab]
    finally:
        for handle in handles:
            handle.remove()
    final = kept["final"]  # [n, d_model]: the stream the final norm is given
    centred = final - final.mean(-1, keepdim=True) if spec.centres else final
    scale = (centred.pow(2).mean(-1, keepdim=True) + spec.eps(eager.config)).sqrt()  # [n, 1]
    gain = norm.weight.detach().double()
    unembedding = eager.lm_head.weight.detach().double()  # [vocab, d_model]
    direction = unembedding[answer] - unembedding[foil]  # [d_model]

    def read(x: torch.Tensor) -> torch.Tensor:  # [n, d_model] -> [n]
        x = x - x.mean(-1, keepdim=True) if spec.centres else x
        return (x * gain / scale) @ direction

    n = len(ids)
    with torch.no_grad():
        embeddings = spec.embeddings(eager, ids).double()
    parts, stream = {"embeddings": read(embeddings)}, embeddings.clone()
    heads = spec.heads(eager.config)
    for layer, block in enumerate(blocks):
        projection = spec.projection(block)
        z, weight = kept[("z", layer)], projection.weight.detach().double()  # z [n, heads * d_v]
        width = z.shape[-1] // heads
        for head in range(heads):
            cut = slice(head * width, (head + 1) * width)
            out = z[:, cut] @ (weight[cut, :] if spec.weight_in_out else weight[:, cut].T)  # [n, d_model]
            parts[f"L{layer} H{head}"] = read(out)
            stream += out
        if projection.bias is not None:
            bias = projection.bias.detach().double().expand(n, -1)
            parts[f"L{layer} attention bias"] = read(bias)
            stream += bias
        parts[f"L{layer} MLP"] = read(kept[("mlp", layer)])
        stream += kept[("mlp", layer)]
    torch.testing.assert_close(stream, final)  # the reference's own parts make up the stream it reads
    if getattr(norm, "bias", None) is not None:
        parts["final norm bias"] = (norm.bias.detach().double() @ direction).expand(n)
    return parts, logits[:, answer] - logits[:, foil]


# -- direct logit attribution -------------------------------------------------------------------------------------
def test_every_part_equals_the_hand_written_reference(decoder):
    found = la.direct_logit_attribution(decoder.model, decoder.ids, decoder.answer, decoder.foil)
    expected, _ = reference_parts(decoder.eager, decoder.spec, decoder.ids, decoder.answer, decoder.foil)
    assert found.labels == list(expected)
    assert found.values.dtype == torch.float64 and found.values.shape == (len(expected), len(decoder.ids))
    torch.testing.assert_close(found.values, torch.stack(list(expected.values())), atol=1e-5, rtol=1e-5)
    heads = [label for label, kind in zip(found.labels, found.kinds, strict=True) if kind == "head"]
    assert len(heads) == sum(found.heads_per_layer) and found.note == la.FROZEN_NOTE


def test_the_parts_sum_to_the_models_logit_difference_at_every_position(decoder):
    """To 1e-6 of the logits' size: Llama's RMSNorm computes in float32 even in a float64 model."""
    found = la.direct_logit_attribution(decoder.model, decoder.ids, decoder.answer, decoder.foil)
    _, eager_difference = reference_parts(decoder.eager, decoder.spec, decoder.ids, decoder.answer, decoder.foil)
    with torch.no_grad():
        logits = decoder.model(input_ids=torch.tensor([decoder.ids])).logits[0].double()
    size = logits.abs().amax(-1)  # [n]
    assert ((found.values.sum(0) - found.logit_difference).abs() <= 1e-6 * size).all()
    assert ((found.logit_difference - eager_difference).abs() <= 1e-6 * size).all()


def test_swapping_the_answer_and_the_foil_negates_every_part(decoder):
    forward = la.direct_logit_attribution(decoder.model, decoder.ids, decoder.answer, decoder.foil)
    backward = la.direct_logit_attribution(decoder.model, decoder.ids, decoder.foil, decoder.answer)
    assert backward.labels == forward.labels
    torch.testing.assert_close(backward.values, -forward.values, atol=1e-12, rtol=0)
    torch.testing.assert_close(backward.logit_difference, -forward.logit_difference, atol=1e-12, rtol=0)


def test_layer_2s_induction_heads_carry_the_induction_answer(gpt):
    """The heads of the last layer that attend like induction heads (measured on the circuit's sequences, not
    named) carry most of the answer's logit difference at the last position, and the largest part is one of them;
    the words name that head first."""
    scores = ind.circuit_scores(gpt.model, circuits.ordinary_token_ids(gpt.tokenizer), period=50, seed=11,
                                bos=0)["induction"]  # [layers, heads]
    layer = TINY_GPT_LAYERS - 1
    induction = [head for head in range(scores.shape[1]) if scores[layer, head] > ind.ATTENDS]
    assert induction
    found = la.direct_logit_attribution(gpt.model, gpt.ids, gpt.answer, gpt.foil)
    total = float(found.logit_difference[-1])
    heads = found.head_map()  # [layers, heads] at the last position
    carried = float(heads[layer, induction].sum())
    assert total > 0 and carried > 0.5 * total, (carried, total)
    best = int(found.values[:, -1].argmax())
    assert (found.layers[best], found.heads[best]) in [(layer, head) for head in induction]
    words = la.attribution_words(found, answer_text="A", foil_text="F")
    assert words[1].startswith(f"Pushing most toward 'A': {found.labels[best]} (")
    assert f"{total:.3g}" in words[0] and "prefers 'A' to 'F'" in words[0]


def reference_post_norm_parts(eager, ids: list[int], answer: int,
                              foil: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """BERT's parts by hand, carried *forward* (attnviz reads them back): each part a ``[n, d]`` vector pushed
    through every later LayerNorm at the scale the eager model computed there (from the norm's own input, a pre-hook),
    the head's dense layer, its GELU at the gate it had (output over input, unit by unit), its LayerNorm, and finally
    the decoder's answer row minus its foil row. Each norm's and linear layer's bias joins as a part where it is
    added. At every step the parts must add up to what the eager model computed there."""
    kept, handles = {}, []

    def keep_in(module, key):
        handles.append(module.register_forward_pre_hook(lambda _, args: kept.__setitem__(key, args[0][0].double())))

    def keep_out(module, key):
        handles.append(module.register_forward_hook(lambda _, __, out: kept.__setitem__(key, out[0].double())))

    for index, layer in enumerate(eager.bert.encoder.layer):
        keep_in(layer.attention.output.dense, ("z", index))
        keep_in(layer.attention.output.LayerNorm, ("y1", index))
        keep_out(layer.output.dense, ("mlp", index))
        keep_in(layer.output.LayerNorm, ("y2", index))
    transform = eager.cls.predictions.transform
    keep_out(transform.dense, "t")
    keep_in(transform.LayerNorm, "u")
    try:
        with torch.no_grad():
            out = eager(input_ids=torch.tensor([ids]), output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    logits = out.logits[0].double()

    def normed(parts: dict, given: torch.Tensor, norm: torch.nn.LayerNorm, bias_label: str) -> dict:
        torch.testing.assert_close(sum(parts.values()), given)  # the parts make up what the norm was given
        scale = (given.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # [n, 1], frozen
        result = {label: (p - p.mean(-1, keepdim=True)) * norm.weight.double() / scale for label, p in parts.items()}
        result[bias_label] = norm.bias.double().expand_as(given)
        return result

    n, heads = len(ids), eager.config.num_attention_heads
    parts = {"embeddings": out.hidden_states[0][0].double()}
    with torch.no_grad():
        for index, layer in enumerate(eager.bert.encoder.layer):
            dense = layer.attention.output.dense
            z, weight = kept[("z", index)], dense.weight.double()  # z [n, heads * d_head], weight [out, in]
            width = z.shape[-1] // heads
            for head in range(heads):
                cut = slice(head * width, (head + 1) * width)
                parts[f"L{index} H{head}"] = z[:, cut] @ weight[:, cut].T
            parts[f"L{index} attention bias"] = dense.bias.double().expand(n, -1)
            parts = normed(parts, kept[("y1", index)], layer.attention.output.LayerNorm,
                           f"L{index} attention norm bias")
            parts[f"L{index} MLP"] = kept[("mlp", index)]
            parts = normed(parts, kept[("y2", index)], layer.output.LayerNorm, f"L{index} MLP norm bias")
        torch.testing.assert_close(sum(parts.values()), out.hidden_states[-1][0].double())
        parts = {label: p @ transform.dense.weight.double().T for label, p in parts.items()}
        parts["output head transform.dense bias"] = transform.dense.bias.double().expand(n, -1)
        t = kept["t"]
        gate = kept["u"] / t  # GELU's output over its input, unit by unit
        parts = {label: p * gate for label, p in parts.items()}
        parts = normed(parts, kept["u"], transform.LayerNorm, "output head transform.LayerNorm bias")
        decoder = eager.cls.predictions.decoder
        direction = decoder.weight.double()[answer] - decoder.weight.double()[foil]  # [d]
        shares = {label: p @ direction for label, p in parts.items()}
    shares["unembedding bias"] = (decoder.bias[answer] - decoder.bias[foil]).double().expand(n)
    return shares, logits[:, answer] - logits[:, foil]


def test_a_post_norm_masked_lm_equals_its_parts_carried_forward_by_hand(bert):
    found = la.direct_logit_attribution(bert.model, bert.ids, bert.answer, bert.foil)
    expected, eager_difference = reference_post_norm_parts(bert.eager, bert.ids, bert.answer, bert.foil)
    assert found.labels == list(expected)
    torch.testing.assert_close(found.values, torch.stack(list(expected.values())), atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(found.values.sum(0), eager_difference, atol=1e-9, rtol=1e-9)
    assert "every norm's scale" in found.note and "GELU" in found.note
    assert found.head_map().shape == (2, 4) and {"norm bias", "output head bias"} <= set(found.kinds)


@pytest.mark.parametrize("name", ["roberta", "distilbert", "electra"])
def test_other_post_norm_masked_lms_add_up(name):
    """RoBERTa calls its GELU as a function (recognised by its values), DistilBERT's MLP is a container, ELECTRA's
    head narrows to its embedding width: each still adds up, and swapping the answer and the foil negates every
    part."""
    torch.manual_seed(0)
    shape = dict(num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, vocab_size=120)
    model = {"roberta": lambda: T.RobertaForMaskedLM(T.RobertaConfig(hidden_size=32, **shape)),
             "distilbert": lambda: T.DistilBertForMaskedLM(T.DistilBertConfig(dim=32, n_heads=4, n_layers=2,
                                                                                hidden_dim=64, vocab_size=120)),
             "electra": lambda: T.ElectraForMaskedLM(T.ElectraConfig(hidden_size=32, embedding_size=16, **shape))}
    model, _ = _pair(_random_norms_and_biases(model[name]()))
    ids = _ids(4)
    forward = la.direct_logit_attribution(model, ids, 7, 11)
    backward = la.direct_logit_attribution(model, ids, 11, 7)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    torch.testing.assert_close(forward.values.sum(0), logits[:, 7] - logits[:, 11], atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(backward.values, -forward.values, atol=1e-12, rtol=0)
    assert sum(kind == "head" for kind in forward.kinds) == 8 and forward.kinds.count("norm bias") == 4


def test_a_norm_after_the_attention_in_a_pre_norm_block_is_refused_with_the_reasons():
    """Gemma 2 normalises each attention's and MLP's output before adding it: neither a plain sum nor post-norm."""
    torch.manual_seed(0)
    model, _ = _pair(T.Gemma2ForCausalLM(T.Gemma2Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=2,
        intermediate_size=64, vocab_size=120, final_logit_softcapping=None, attn_logit_softcapping=None)))
    with pytest.raises(NotReadable) as refused:
        la.direct_logit_attribution(model, _ids(3), 7, 11)
    said = str(refused.value)
    assert "not the sum of its parts" in said and "norm after its attention" in said
    assert "nor does it read as a post-norm model" in said


def test_logits_scaled_after_the_unembedding_are_refused_and_a_parallel_block_is_not():
    """Cohere: attention and MLP side by side on one norm, logits scaled by ``logit_scale`` after the unembedding.
    With a scale of 1 the parts still sum to the logits; with 1/4 both the attribution and the lens refuse."""
    for scale in (1.0, 0.25):
        torch.manual_seed(0)
        model, _ = _pair(T.CohereForCausalLM(T.CohereConfig(hidden_size=32, num_attention_heads=4,
                                                            num_hidden_layers=2, intermediate_size=64,
                                                            vocab_size=120, logit_scale=scale,
                                                            initializer_range=0.2)))
        ids = _ids(3)
        if scale == 1.0:
            found = la.direct_logit_attribution(model, ids, 7, 11)
            assert ((found.values.sum(0) - found.logit_difference).abs() <= 1e-6).all()
            continue
        with pytest.raises(NotReadable, match="not its unembedding's output"):
            la.direct_logit_attribution(model, ids, 7, 11)
        with pytest.raises(NotReadable, match="does not give the model's own logits"):
            la.logit_lens(model, ids, 7, 11)


def test_what_cannot_be_attributed_is_said(gpt):
    with pytest.raises(ValueError, match="same token"):
        la.direct_logit_attribution(gpt.model, gpt.ids, 5, 5)
    with pytest.raises(ValueError, match="empty"):
        la.logit_lens(gpt.model, [], 5, 6)
    with pytest.raises(ValueError, match="not a token of the model's vocabulary"):
        la.logit_lens(gpt.model, gpt.ids, 5, 10**6)
    gpt.model.train()
    try:
        with pytest.raises(ValueError, match="training mode"):
            la.direct_logit_attribution(gpt.model, gpt.ids, 5, 6)
    finally:
        gpt.model.eval()


# -- the logit lens -----------------------------------------------------------------------------------------------
def _lens_reference(logits_rows: list[torch.Tensor], answer: int, foil: int) -> dict[str, torch.Tensor]:
    rows = torch.stack([row.double() for row in logits_rows])  # [L + 1, n, vocab]
    answer_logit = rows[..., answer]
    return {"difference": answer_logit - rows[..., foil], "probability": rows.softmax(-1)[..., answer],
            "rank": (rows > answer_logit[..., None]).sum(-1) + 1, "top": rows.argmax(-1)}


def _assert_lens(found: la.Lens, expected: dict[str, torch.Tensor]) -> None:
    torch.testing.assert_close(found.difference, expected["difference"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(found.probability, expected["probability"], atol=1e-7, rtol=1e-5)
    assert torch.equal(found.rank, expected["rank"]) and torch.equal(found.top, expected["top"])


def test_the_lens_equals_the_final_norm_and_unembedding_applied_by_hand(decoder):
    """Rows before the last: the eager model's hidden states entering each layer, through its final norm and its
    unembedding; the last row: the eager model's own logits (its last hidden state is already normed)."""
    found = la.logit_lens(decoder.model, decoder.ids, decoder.answer, decoder.foil)
    eager = decoder.eager
    with torch.no_grad():
        outputs = eager(input_ids=torch.tensor([decoder.ids]), output_hidden_states=True)
        norm = decoder.spec.norm(eager)
        rows = [eager.lm_head(norm(hidden))[0] for hidden in outputs.hidden_states[:-1]] + [outputs.logits[0]]
    assert found.difference.shape == (len(decoder.spec.blocks(eager)) + 1, len(decoder.ids))
    assert found.rows[0].startswith("embeddings") and found.rows[-1].startswith("out of layer")
    _assert_lens(found, _lens_reference(rows, decoder.answer, decoder.foil))


def test_the_lens_of_the_last_layer_is_the_models_own_prediction(decoder):
    found = la.logit_lens(decoder.model, decoder.ids, decoder.answer, decoder.foil)
    with torch.no_grad():
        logits = decoder.model(input_ids=torch.tensor([decoder.ids])).logits[0].double()
    torch.testing.assert_close(found.difference[-1], logits[:, decoder.answer] - logits[:, decoder.foil])
    assert torch.equal(found.top[-1], logits.argmax(-1))
    attributed = la.direct_logit_attribution(decoder.model, decoder.ids, decoder.answer, decoder.foil)
    torch.testing.assert_close(found.difference[-1], attributed.logit_difference)


def test_the_lens_of_a_masked_lm_applies_its_whole_head(bert):
    """BERT: every layer's output is already normed; each goes through ``cls`` (dense, GELU, LayerNorm, decoder)."""
    found = la.logit_lens(bert.model, bert.ids, bert.answer, bert.foil)
    with torch.no_grad():
        outputs = bert.eager(input_ids=torch.tensor([bert.ids]), output_hidden_states=True)
        rows = [bert.eager.cls(hidden)[0] for hidden in outputs.hidden_states]
    torch.testing.assert_close(rows[-1], outputs.logits[0])
    assert "cls" in found.note and found.difference.shape == (3, len(bert.ids))
    _assert_lens(found, _lens_reference(rows, bert.answer, bert.foil))


# -- words ----------------------------------------------------------------------------------------------------------
def _attribution(values: list[float]) -> la.Attribution:
    labels = ["embeddings", "L0 H0", "L0 H1", "L0 MLP"]
    return la.Attribution(torch.tensor(values, dtype=torch.float64)[:, None], labels,
                          ["embeddings", "head", "head", "mlp"], [None, 0, 0, 0], [None, 0, 1, None],
                          torch.tensor([sum(values)], dtype=torch.float64), [2], 1, 2, la.FROZEN_NOTE)


def test_the_attribution_words_follow_the_numbers():
    words = la.attribution_words(_attribution([0.5, 3.0, -1.0, 0.5]), answer_text="cat", foil_text="dog")
    assert words[0].startswith("At position 0 the model prefers 'cat' to 'dog': logit difference 3,")
    assert words[1] == "Pushing most toward 'cat': L0 H0 (+3, 100% of the difference), embeddings (+0.5, 17% of " \
                       "the difference), L0 MLP (+0.5, 17% of the difference)."
    assert words[2] == "Pushing most toward 'dog': L0 H1 (-1, -33% of the difference)."
    assert words[3] == "Of the difference: the heads together +2 (67%), the MLPs +0.5 (17%), the embeddings +0.5 (17%)."
    cancelling = la.attribution_words(_attribution([2.0, -2.0, 0.01, 0.0]))
    assert "the model prefers token 1 to token 2: logit difference 0.01" in cancelling[0]
    assert "mostly cancel" in cancelling[-1] and "%" not in cancelling[1]
    against = la.attribution_words(_attribution([-1.0, -2.0, -0.5, -0.5]))
    assert "does not prefer" in against[0] and against[1] == "No part pushes toward token 1."


def _lens(tops: list[int], differences: list[float]) -> la.Lens:
    rows = len(tops)
    return la.Lens(torch.tensor(differences, dtype=torch.float64)[:, None],
                   torch.linspace(0.1, 0.9, rows, dtype=torch.float64)[:, None],
                   torch.tensor([1 if top == 5 else 3 for top in tops])[:, None], torch.tensor(tops)[:, None],
                   ap.residual_rows(rows - 1), 5, 6, "")


def test_the_lens_words_follow_the_numbers():
    words = la.lens_words(_lens([9, 5, 5, 5], [-1.0, 2.0, 2.5, 4.0]), answer_text="cat", foil_text="dog")
    assert words[0] == "At position 0 'cat' is first the top token into layer 1 (probability 0.367), and stays the " \
                       "top token from there on."
    assert words[1] == "The logit difference over 'dog' goes from -1 (embeddings (into layer 0)) to 4 (out of layer 2)."
    assert words[2] == "Layer 0 moves it most (+3, toward 'cat')."
    never = la.lens_words(_lens([9, 9, 8], [0.0, -1.0, -2.0]), token_text=lambda token: f"t{token}")
    assert never[0].startswith("At position 0 token 5 is never the top token: out of layer 1 the top token is 't8' "
                               "and token 5 ranks 3")
    assert never[2] == "Layer 0 moves it most (-1, toward token 6)."  # two equal steps: the first named
    lost = la.lens_words(_lens([5, 9, 9], [1.0, 0.0, -1.0]))
    assert "but does not stay on top (top in 1 of 3 rows" in lost[0]


# -- figures --------------------------------------------------------------------------------------------------------
def test_the_figures_show_the_parts_heads_and_lens(gpt):
    found = la.direct_logit_attribution(gpt.model, gpt.ids, gpt.answer, gpt.foil)
    bars = figures.attribution_bars(found.values[:, -1], found.labels, found.layers, title="What pushes toward 'x'",
                                    total=float(found.logit_difference[-1]))
    assert isinstance(bars, go.Figure) and len(bars.data[0].y) == len(found.labels) and len(bars.data) == 2
    ticks = bars.layout.xaxis.tickvals
    assert len(ticks) == len(found.labels) + 1 and list(ticks) == sorted(ticks)
    assert list(bars.layout.xaxis.ticktext[:2]) == ["embeddings", "L0 H0"]
    assert {annotation.text for annotation in bars.layout.annotations} == {f"layer {i}" for i in range(3)}
    best = int(found.values[:, -1].argmax())
    assert f"{float(found.values[best, -1]):.3g}" in bars.data[0].hovertext[best]
    assert bars.data[0].marker.color[best] == figures.TOWARD_ANSWER

    heads = figures.attribution_head_map(found.head_map(), title="Each head's push toward 'x'")
    assert heads.data[0].zmid == 0 and len(heads.data[0].z) == 3

    lens = la.logit_lens(gpt.model, gpt.ids, gpt.answer, gpt.foil)
    tokens = [str(token) for token in gpt.ids]
    top_tokens = [[str(token) for token in row] for row in lens.top.tolist()]
    heat = figures.lens_heatmap(lens.difference, lens.rows, tokens, title="The logit lens",
                                probability=lens.probability, rank=lens.rank, top_tokens=top_tokens,
                                answer_top=lens.top == lens.answer)
    trace = heat.data[0]
    assert trace.zmid == 0 and trace.zmin == -trace.zmax and len(trace.z) == len(lens.rows)
    assert all(isinstance(tick, int) for tick in heat.layout.xaxis.tickvals)
    assert heat.layout.xaxis.ticktext[0] == f"0 · {tokens[0]}"
    assert f"{float(lens.difference[-1, -1]):.3g}" in trace.hovertext[-1][-1]
    assert len(heat.data[1].x) == int((lens.top == lens.answer).sum())
