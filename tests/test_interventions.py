"""Head interventions against independent references: the same edit made on the output projection of a copy of
the model (zeroed columns; a mean folded into the bias; the projection's input patched by a forward pre-hook; a
gate on the projection's input, differentiated), on GPT-2, Llama (grouped-query), BERT and T5 (encoder, decoder,
cross)."""

import copy

import pytest
import torch
import transformers as T

from attnviz.interventions import edits as iv
from attnviz.interventions import importance as imp


def _tiny(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = {
        "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=100,
                                                       n_positions=64, bos_token_id=0, eos_token_id=0)),
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(hidden_size=32, num_attention_heads=4,
                                                          num_key_value_heads=2, num_hidden_layers=2,
                                                          intermediate_size=64, vocab_size=100)),
        "bert": lambda: T.BertModel(T.BertConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                                                 intermediate_size=64, vocab_size=100)),
        "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(d_model=32, d_kv=8, num_heads=4, num_layers=2,
                                                              num_decoder_layers=2, d_ff=64, vocab_size=100,
                                                              decoder_start_token_id=0, pad_token_id=0)),
    }[name]()
    model.eval().double()  # float64: the references agree to 1e-6 in rounding, not by luck
    model.set_attn_implementation(iv.ATTENTION_NAME)
    return model


ARCHITECTURES = ("gpt2", "llama", "bert", "t5")


def _inputs(name: str, seed: int = 1) -> dict:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 100, (2, 10), generator=generator)
    inputs = {"input_ids": ids, "attention_mask": torch.ones(2, 10, dtype=torch.long)}
    inputs["attention_mask"][1, 7:] = 0  # the second text is shorter: padding must not change the first's
    if name == "t5":
        inputs["decoder_input_ids"] = torch.randint(1, 100, (2, 6), generator=generator)
    return inputs


def _output(model, inputs) -> torch.Tensor:
    outputs = model(**inputs)
    return outputs.logits if hasattr(outputs, "logits") else outputs.last_hidden_state


def _projection(model: torch.nn.Module, module_name: str) -> tuple[torch.nn.Module, bool]:
    """The output projection that reads ``module_name``'s heads, and whether its weight is [in, out] (Conv1D)."""
    modules = dict(model.named_modules())
    attention = modules[module_name]
    for child in ("c_proj", "o_proj", "o"):
        if hasattr(attention, child):
            projection = getattr(attention, child)
            return projection, isinstance(projection, T.pytorch_utils.Conv1D)
    parent = modules[module_name.rsplit(".", 1)[0]]  # BERT: attention.self -> attention.output.dense
    return parent.output.dense, False


def _head_columns(model, module_name: str, head: int, heads: int) -> slice:
    projection, conv = _projection(model, module_name)
    width = (projection.weight.shape[0] if conv else projection.weight.shape[1]) // heads
    return slice(head * width, (head + 1) * width)


def _with_bias(projection: torch.nn.Module) -> torch.nn.Module:
    if projection.bias is None:  # Llama and T5 have none: the reference folds the mean into a new one
        projection.bias = torch.nn.Parameter(torch.zeros(projection.weight.shape[0], dtype=projection.weight.dtype))
    return projection


def _sites(name: str, model) -> list[tuple[iv.AttentionModule, int]]:
    modules = iv.attention_modules(model, _inputs(name))
    return [(module, head) for module in modules for head in (0, module.heads - 1)]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_zeroing_a_head_equals_zeroing_its_columns_of_the_output_projection(name):
    model = _tiny(name)
    inputs = _inputs(name)
    kinds = set()
    with torch.no_grad():
        clean = _output(model, inputs)
        for module, head in _sites(name, model):
            with iv.edited(model, iv.zeroed(module.name, head)):
                edited = _output(model, inputs)
            reference = copy.deepcopy(model)
            projection, conv = _projection(reference, module.name)
            columns = _head_columns(reference, module.name, head, module.heads)
            if conv:
                projection.weight[columns, :] = 0
            else:
                projection.weight[:, columns] = 0
            expected = _output(reference, inputs)
            assert torch.allclose(edited, expected, atol=1e-6, rtol=0), (module.name, head)
            assert not torch.allclose(edited, clean, atol=1e-6), (module.name, head)  # the edit did something
            kinds.add(module.kind)
    assert kinds == ({"encoder", "decoder", "cross"} if name == "t5" else {"self"})


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_mean_ablation_equals_the_mean_folded_into_the_projection_bias(name):
    model = _tiny(name)
    inputs = _inputs(name)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        recorded, _ = iv.head_outputs(model, inputs)
        for module, head in _sites(name, model):
            # the encoder's queries are the text's tokens; the decoder's (and cross's) the decoder's, all real
            query_real = real if module.kind in ("self", "encoder") else None
            mean = iv.mean_over_tokens(recorded[module.name], query_real)[head]  # [d_v]
            with iv.edited(model, {module.name: {head: mean}}):
                edited = _output(model, inputs)
            reference = copy.deepcopy(model)
            projection, conv = _projection(reference, module.name)
            _with_bias(projection)
            columns = _head_columns(reference, module.name, head, module.heads)
            if conv:
                projection.bias += mean @ projection.weight[columns, :]
                projection.weight[columns, :] = 0
            else:
                projection.bias += projection.weight[:, columns] @ mean
                projection.weight[:, columns] = 0
            assert torch.allclose(edited, _output(reference, inputs), atol=1e-6, rtol=0), (module.name, head)


def _pre_hook_patch(model, module_name: str, columns: slice, source: torch.Tensor):
    projection, _ = _projection(model, module_name)

    def hook(_, arguments):
        patched = arguments[0].clone()
        patched[..., columns] = source[..., columns]
        return (patched,)

    return projection.register_forward_pre_hook(hook)


def _projection_inputs(model, module_name: str, inputs: dict) -> torch.Tensor:
    projection, _ = _projection(model, module_name)
    kept = []
    handle = projection.register_forward_pre_hook(lambda _, arguments: kept.append(arguments[0].detach()))
    with torch.no_grad():
        _output(model, inputs)
    handle.remove()
    return kept[0]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_patching_a_head_from_another_input_equals_patching_the_projection_input(name):
    model = _tiny(name)
    clean_inputs, corrupted_inputs = _inputs(name, seed=1), _inputs(name, seed=2)
    with torch.no_grad():
        clean_outputs, _ = iv.head_outputs(model, clean_inputs)
        corrupted = _output(model, corrupted_inputs)
        for module, head in _sites(name, model):
            source = clean_outputs[module.name][:, :, head]  # [batch, n_q, d_v]
            with iv.edited(model, {module.name: {head: source}}):
                patched = _output(model, corrupted_inputs)
            columns = _head_columns(model, module.name, head, module.heads)
            handle = _pre_hook_patch(model, module.name, columns, _projection_inputs(model, module.name,
                                                                                     clean_inputs))
            expected = _output(model, corrupted_inputs)
            handle.remove()
            assert torch.allclose(patched, expected, atol=1e-6, rtol=0), (module.name, head)
            assert not torch.allclose(patched, corrupted, atol=1e-6)
            # patching an input with itself changes nothing
            own, _ = iv.head_outputs(model, corrupted_inputs)
            with iv.edited(model, {module.name: {head: own[module.name][:, :, head]}}):
                assert torch.allclose(_output(model, corrupted_inputs), corrupted, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ("gpt2", "llama", "t5"))
def test_gradient_importance_matches_a_gate_on_the_projection_input(name):
    """Michel et al.'s importance, |dL/dg| per text averaged: the reference puts the gate on the output
    projection's input columns instead (a forward pre-hook), and differentiates each text's loss on its own."""
    model = _tiny(name)
    inputs = _inputs(name)
    objective = imp.objective_of(model)
    batch = imp.Batch(dict(inputs), inputs["attention_mask"].bool(), [[]] * 2, ["a", "b"], [False] * 2)
    if objective == "seq2seq":
        batch.inputs["labels"] = batch.inputs.pop("decoder_input_ids")
        batch.real = torch.ones(2, 6, dtype=torch.bool)  # the decoder's queries: all real
    gradients = imp.gradient_importance(model, batch)
    assert gradients.values.shape == (len(gradients.modules), 4)

    def reference(module, head) -> float:
        projection, _ = _projection(model, module.name)
        columns = _head_columns(model, module.name, head, module.heads)
        gate = torch.ones((), dtype=torch.float64, requires_grad=True)

        def hook(_, arguments):
            chosen = torch.zeros(arguments[0].shape[-1], dtype=torch.bool)
            chosen[columns] = True
            return (arguments[0] * torch.where(chosen, gate, torch.ones((), dtype=gate.dtype)),)

        handle = projection.register_forward_pre_hook(hook)
        slopes = []
        for text in range(2):
            losses, counted = imp.token_losses(model, batch, model(**batch.inputs), objective)
            (slope,) = torch.autograd.grad(imp.text_losses(losses, counted)[text], gate)
            slopes.append(abs(float(slope)))
        handle.remove()
        return sum(slopes) / 2

    for row, module in enumerate(gradients.modules):
        for head in (0, module.heads - 1):
            expected = reference(module, head)
            assert expected > 1e-5  # the head matters a little, so the comparison means something
            assert abs(float(gradients.values[row, head]) - expected) < 1e-6, (module.name, head)


def test_interventions_refuse_a_model_whose_attention_they_cannot_reach():
    model = T.GPT2LMHeadModel(T.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16,
                                           bos_token_id=0, eos_token_id=0))
    model.set_attn_implementation("eager")
    assert "not through attnviz's attention function" in iv.editable(model)
    assert iv.editable(_tiny("gpt2")) is None


def test_edits_end_with_their_block_and_stay_in_their_thread():
    import threading

    model = _tiny("gpt2")
    inputs = _inputs("gpt2")
    with torch.no_grad():
        clean = _output(model, inputs)
        elsewhere = []
        with iv.edited(model, iv.zeroed("transformer.h.0.attn", [0, 1, 2, 3])):
            thread = threading.Thread(target=lambda: elsewhere.append(_output(model, inputs)))
            thread.start()
            thread.join()
            assert not torch.allclose(_output(model, inputs), clean)
        assert torch.equal(_output(model, inputs), clean)
    assert torch.equal(elsewhere[0], clean)  # another session's forward during the block is untouched


# Attention in the model's own code (read by hooks or by eager weights): edits go through a pre-hook on the output
# projection, the reference zeroes that projection's weight columns
OWN_CODE = {"gpt_neo": "out_proj", "mpnet": "o", "bloom": "dense", "mpt": "out_proj", "deberta-v2": "output.dense"}


def _own_code_model(kind: str) -> torch.nn.Module:
    from attnviz.bench.tiny import tiny_config

    torch.manual_seed(0)
    causal = kind in ("gpt_neo", "bloom", "mpt")
    builder = T.AutoModelForCausalLM if causal else T.AutoModel
    model = builder.from_config(tiny_config(kind), attn_implementation="eager").eval().double()
    return model


@pytest.mark.parametrize("kind", list(OWN_CODE))
def test_models_whose_attention_runs_in_their_own_code_are_edited_at_their_output_projection(kind):
    model = _own_code_model(kind)
    assert iv.editable(model) is None  # the hooks are installed on the first check
    inputs = {"input_ids": torch.randint(5, 90, (2, 9), generator=torch.Generator().manual_seed(3)),
              "attention_mask": torch.ones(2, 9, dtype=torch.long)}
    modules = iv.attention_modules(model, inputs)
    assert len(modules) == 2 and all(module.heads == 4 for module in modules)
    with torch.no_grad():
        clean = _output(model, inputs)
        recorded, _ = iv.head_outputs(model, inputs)
        for module in modules:
            projection = model.get_submodule(f"{module.name}.{OWN_CODE[kind]}")
            width = projection.weight.shape[1] // module.heads
            columns = slice(width, 2 * width)  # head 1
            with iv.edited(model, iv.zeroed(module.name, 1)):
                edited = _output(model, inputs)
            reference = copy.deepcopy(model)
            reference.get_submodule(f"{module.name}.{OWN_CODE[kind]}").weight[:, columns] = 0
            assert torch.allclose(edited, _output(reference, inputs), atol=1e-6, rtol=0), module.name
            assert not torch.allclose(edited, clean, atol=1e-6)
            own = recorded[module.name][:, :, 1]
            with iv.edited(model, {module.name: {1: own}}):  # patching with its own output changes nothing
                assert torch.allclose(_output(model, inputs), clean, atol=1e-12, rtol=0)
        assert torch.equal(_output(model, inputs), clean)  # outside a block the hooks do nothing


def test_a_layer_shared_by_every_layer_is_edited_one_layer_at_a_time():
    """ALBERT calls one attention module for every layer: each call is its own layer (``name@k``), and zeroing a
    head of layer 1 equals zeroing that head's input to the output projection on its second call only."""
    torch.manual_seed(0)
    model = T.AlbertModel(T.AlbertConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=3,
                                         intermediate_size=64, vocab_size=100, embedding_size=16)).eval().double()
    model.set_attn_implementation(iv.ATTENTION_NAME)
    inputs = _inputs("albert")
    modules = iv.attention_modules(model, inputs)
    assert [module.label for module in modules] == ["layer 0", "layer 1", "layer 2"]
    assert len({module.name for module in modules}) == 3
    projection = model.get_submodule(modules[0].name).dense
    width = projection.weight.shape[1] // 4
    with torch.no_grad():
        clean = _output(model, inputs)
        for layer, module in enumerate(modules):
            with iv.edited(model, iv.zeroed(module.name, 2)):
                edited = _output(model, inputs)
                again = _output(model, inputs)  # two forwards in one block: each starts counting again
            calls = []

            def hook(_, arguments, layer=layer, calls=calls):
                calls.append(1)
                if len(calls) - 1 != layer:
                    return None
                zeroed = arguments[0].clone()
                zeroed[..., 2 * width: 3 * width] = 0
                return (zeroed,)

            handle = projection.register_forward_pre_hook(hook)
            expected = _output(model, inputs)
            handle.remove()
            assert len(calls) == 3
            assert torch.allclose(edited, expected, atol=1e-6, rtol=0), layer
            assert torch.equal(edited, again)
            assert not torch.allclose(edited, clean, atol=1e-6)


def test_an_edit_block_edits_only_its_own_model():
    model, other = _tiny("gpt2"), _tiny("gpt2")
    inputs = _inputs("gpt2")
    own_code, own_code_other = _own_code_model("gpt_neo"), _own_code_model("gpt_neo")
    iv.install_projection_hooks(own_code_other)
    with torch.no_grad():
        clean, clean_own_code = _output(other, inputs), _output(own_code_other, inputs)
        with iv.edited(model, iv.zeroed("transformer.h.0.attn", [0, 1, 2, 3])):
            assert torch.equal(_output(other, inputs), clean)
        with iv.edited(own_code, iv.zeroed("transformer.h.0.attn.attention", [0, 1, 2, 3])):
            assert torch.equal(_output(own_code_other, inputs), clean_own_code)
        iv.install_projection_hooks(own_code)
        with iv.edited(own_code, iv.zeroed("transformer.h.0.attn.attention", [0, 1, 2, 3])):
            assert not torch.equal(_output(own_code, inputs), clean_own_code)  # the edit acts on its own model
