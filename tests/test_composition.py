"""Composition scores between heads (attnviz.interventions.composition) against an independent reference: each head's
maps derived functionally, by feeding an identity matrix through the model's own projection modules and splitting
the output as transformers' attention code does (for GQA with transformers' own ``repeat_kv``), or, for the families
whose attention code splits its projections in its own ways (Falcon, CodeGen, GPT-BigCode without multi-query
attention, ALBERT, T5, BART-likes), by running that attention code itself on an identity matrix and taking the
queries, keys and values it hands its attention function (DeBERTa: its own ``transpose_for_scores``); then dense
d_model x d_model products and ``torch.linalg.matrix_norm``. Tiny models built from configs, CPU, no downloads."""

import copy
import dataclasses
import math
import sys
from unittest import mock

import numpy as np
import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import repeat_kv

from attnviz.interventions import composition
from attnviz.models.shipped import BUNDLED_GPT_DIR
from attnviz.viz import composition as composition_viz

RTOL = 1e-5


def _roughen(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Norm gains and biases away from their init (ones, zeros), so folding and ignoring biases are both tested."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim != 1:
                continue
            noise = torch.randn(parameter.shape, generator=generator)
            if "norm" in name.lower() or "ln_" in name:
                parameter.copy_(parameter + 0.5 * noise if name.endswith("weight") else 0.1 * noise)
            else:
                parameter.copy_(0.1 * noise)  # projection biases
    return model.eval()


def tiny_gpt2():
    model = transformers.AutoModelForCausalLM.from_pretrained(BUNDLED_GPT_DIR, attn_implementation="eager")
    return _roughen(model, 1)


def tiny_llama(model_type: str = "llama"):
    torch.manual_seed(0)
    classes = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "mistral": transformers.MistralConfig}
    config = classes[model_type](hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=40, max_position_embeddings=64)
    if model_type == "llama":
        config.attention_bias = True
    return _roughen(transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager"), 2)


def tiny_bert(model_type: str = "bert"):
    torch.manual_seed(0)
    if model_type == "electra":  # ELECTRA's encoder is BERT's, with its embeddings' own width
        config = transformers.ElectraConfig(hidden_size=64, embedding_size=64, intermediate_size=96,
                                            num_hidden_layers=3, num_attention_heads=4, vocab_size=40,
                                            max_position_embeddings=64)
        return _roughen(transformers.ElectraModel(config), 3)
    config = transformers.BertConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                                     vocab_size=40, max_position_embeddings=64)
    return _roughen(transformers.BertModel(config, add_pooling_layer=False), 3)


def tiny_neox():
    torch.manual_seed(0)
    config = transformers.GPTNeoXConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                        num_attention_heads=4, vocab_size=40, max_position_embeddings=64)
    return _roughen(transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager"), 4)


def tiny_linear(model_type: str):
    """Three families read by the generic q_proj / k_proj / v_proj reader: OPT (LayerNorm, out_proj), GPT-J (partial
    RoPE, ln_1) and Gemma (GQA, an RMSNorm that scales by 1 + weight)."""
    torch.manual_seed(0)
    if model_type == "opt":
        config = transformers.OPTConfig(hidden_size=64, ffn_dim=96, num_hidden_layers=3, num_attention_heads=4,
                                        vocab_size=40, word_embed_proj_dim=64, max_position_embeddings=64)
    elif model_type == "gpt_neo":
        config = transformers.GPTNeoConfig(hidden_size=64, num_layers=3, num_heads=4, vocab_size=40,
                                           attention_types=[[["global", "local"], 1], [["global"], 1]],
                                           max_position_embeddings=64)
    elif model_type == "distilbert":  # post-norm: no norm before its attention, so nothing to fold
        config = transformers.DistilBertConfig(dim=64, hidden_dim=96, n_layers=3, n_heads=4, vocab_size=40,
                                               max_position_embeddings=64)
        return _roughen(transformers.DistilBertModel(config), 5)
    elif model_type == "phi3":
        config = transformers.Phi3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=40, pad_token_id=0)
    elif model_type == "mpt":
        config = transformers.MptConfig(d_model=64, n_layers=3, n_heads=4, vocab_size=40)
    elif model_type == "gpt_bigcode":
        config = transformers.GPTBigCodeConfig(n_embd=64, n_layer=3, n_head=4, vocab_size=40, n_positions=64)
    elif model_type == "bloom":
        config = transformers.BloomConfig(hidden_size=64, n_layer=3, n_head=4, vocab_size=40)
    elif model_type == "mpnet":  # post-norm, q/k/v/o inside attention.attn, a relative bias shared by every layer
        config = transformers.MPNetConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                          num_attention_heads=4, vocab_size=40, max_position_embeddings=64)
        return _roughen(transformers.MPNetModel(config), 5)
    elif model_type == "olmo":  # a LayerNorm without weight or bias before each attention
        config = transformers.OlmoConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                         num_attention_heads=4, vocab_size=40, max_position_embeddings=64)
    elif model_type == "gptj":
        config = transformers.GPTJConfig(n_embd=64, n_layer=3, n_head=4, vocab_size=40, rotary_dim=8, n_positions=64)
    else:
        config = transformers.GemmaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=40)
    return _roughen(transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager"), 5)


def tiny_other(name: str):
    """The families whose attention splits its projections its own way, each in its tiny config (2-4 layers, d_model
    32-64): Falcon in its three layouts (grouped K/V heads with two norms; multi-query; per head with ALiBi),
    CodeGen (8 heads over its 4 shards: 2 heads a shard), GPT-BigCode without multi-query attention, DeBERTa-v2 with
    its relative terms and convolution, ALBERT (one shared layer; 2 groups of 2 layers), T5 (d_kv * heads != d_model)
    and the BART family (post-norm BART and Marian, pre-norm mBART and Pegasus)."""
    torch.manual_seed(0)
    auto = transformers.AutoModelForCausalLM
    seq2seq = dict(d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=40,
                   max_position_embeddings=64, decoder_start_token_id=2, pad_token_id=1)
    falcon = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, vocab_size=40)
    if name == "falcon":
        config = transformers.FalconConfig(**falcon, new_decoder_architecture=True, num_kv_heads=2, bias=True)
    elif name == "falcon_mq":
        config = transformers.FalconConfig(**falcon)  # multi_query, parallel attention: the defaults
    elif name == "falcon_alibi":
        config = transformers.FalconConfig(**falcon, multi_query=False, alibi=True, parallel_attn=False, bias=True)
    elif name == "codegen":
        config = transformers.CodeGenConfig(n_embd=64, n_layer=3, n_head=8, rotary_dim=4, vocab_size=40,
                                            n_positions=64)
    elif name == "gpt_bigcode_mha":
        config = transformers.GPTBigCodeConfig(n_embd=64, n_layer=3, n_head=4, vocab_size=40, n_positions=64,
                                               multi_query=False)
    elif name == "deberta-v2":
        config = transformers.DebertaV2Config(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                              intermediate_size=64, vocab_size=40, max_position_embeddings=64,
                                              relative_attention=True, pos_att_type="p2c|c2p",
                                              position_biased_input=False, conv_kernel_size=3, position_buckets=8)
        auto = transformers.AutoModel
    elif name in ("albert", "albert_groups"):
        groups = dict(num_hidden_layers=4, num_hidden_groups=2, inner_group_num=2) if name == "albert_groups" \
            else dict(num_hidden_layers=3)
        config = transformers.AlbertConfig(hidden_size=32, embedding_size=16, num_attention_heads=4,
                                           intermediate_size=64, vocab_size=40, max_position_embeddings=64, **groups)
        auto = transformers.AutoModel
    elif name == "t5":
        config = transformers.T5Config(d_model=32, d_kv=16, num_heads=4, d_ff=64, num_layers=2, num_decoder_layers=3,
                                       vocab_size=40, decoder_start_token_id=0)
        auto = transformers.AutoModel
    else:  # bart, mbart, marian, pegasus
        config = transformers.AutoConfig.for_model(name, **seq2seq)
        auto = transformers.AutoModel
    return _roughen(auto.from_config(config, attn_implementation="eager"), 6)


OTHER_FAMILIES = {"falcon": "falcon", "falcon_mq": "falcon", "falcon_alibi": "falcon", "codegen": "codegen",
                  "gpt_bigcode_mha": "linear", "deberta-v2": "deberta", "albert": "albert", "albert_groups": "albert",
                  "t5": "t5", "t5_decoder": "t5", "bart": "bart", "bart_decoder": "bart", "mbart": "bart",
                  "marian": "bart", "pegasus": "bart"}
STACK_OF = {"t5": "encoder", "t5_decoder": "decoder", "bart": "encoder", "bart_decoder": "decoder",
            "mbart": "encoder", "marian": "encoder", "pegasus": "encoder"}
# post-norm models whose first layer reads no norm: nothing to fold there
NOTHING_TO_FOLD = ("distilbert", "albert", "albert_groups", "marian", "mpnet")


BUILDERS = {"distilbert": lambda: tiny_linear("distilbert"), "phi3": lambda: tiny_linear("phi3"),
            "mpt": lambda: tiny_linear("mpt"),
            "gpt_bigcode": lambda: tiny_linear("gpt_bigcode"), "gpt_neo": lambda: tiny_linear("gpt_neo"),
            "bloom": lambda: tiny_linear("bloom"),
            "electra": lambda: tiny_bert("electra"), "opt": lambda: tiny_linear("opt"),
            "gptj": lambda: tiny_linear("gptj"), "mpnet": lambda: tiny_linear("mpnet"),
            "olmo": lambda: tiny_linear("olmo"),
            "gemma": lambda: tiny_linear("gemma"), "gpt2": tiny_gpt2, "llama": tiny_llama,
            "qwen2": lambda: tiny_llama("qwen2"),
            "mistral": lambda: tiny_llama("mistral"), "bert": tiny_bert, "gpt_neox": tiny_neox,
            **{name: (lambda name=name: built(name.removesuffix("_decoder")) if name.endswith("_decoder")
                      else tiny_other(name)) for name in OTHER_FAMILIES}}
_BUILT = {}


def built(name: str) -> torch.nn.Module:
    """Each tiny model once (tests that change weights take a copy)."""
    if name not in _BUILT:
        _BUILT[name] = BUILDERS[name]()
    return _BUILT[name]


# ------------------------------------------------------------------------------------------ the functional reference


def _linear_map(module: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """What ``module`` does to each row of ``inputs``, less its bias (its output at zero)."""
    with torch.no_grad():
        return module(inputs) - module(torch.zeros_like(inputs[:1]))


def _norm_rows(norm: torch.nn.Module | None, d_model: int) -> tuple[torch.Tensor, float]:
    """The rows fed to a head's projections, and the scale they carry: the identity, or (folding) the norm applied to
    each basis vector less the norm at zero (its bias): ``P diag(gamma) / s`` for a LayerNorm, ``diag(gamma) / s``
    for an RMSNorm, ``s`` the per-token scale the norm divides by."""
    eye = torch.eye(d_model, dtype=torch.float64)
    if norm is None:
        return eye, 1.0
    if isinstance(norm, torch.nn.LayerNorm) or type(norm).__name__ == "OlmoLayerNorm":  # OLMo's: eps 1e-5, no weight
        scale = math.sqrt(float(eye[0].var(unbiased=False)) + getattr(norm, "eps", 1e-5))
    else:
        scale = math.sqrt(1.0 / d_model + getattr(norm, "variance_epsilon", getattr(norm, "eps", None)))
    return _linear_map(norm, eye), scale


class _Handed(Exception):
    """Raised in place of a model's attention function: the query, key and value states its forward handed it."""


def _handed_states(attention: torch.nn.Module, call) -> tuple[torch.Tensor, ...]:
    """``call(rows)`` runs ``attention``'s own forward on ``rows [1, n, d_model]``; what it hands its (eager)
    attention function as query, key and value ``[1, heads or K/V heads, n, d_head]``: every split, reordering and
    rotation its code does before the scores."""
    code = sys.modules[type(attention).__module__]

    def handed(module, query, key, value, *args, **kwargs):
        raise _Handed(query, key, value)

    def states(rows):
        with mock.patch.object(code, "eager_attention_forward", handed), pytest.raises(_Handed) as caught:
            with torch.no_grad():
                call(rows)
        return caught.value.args

    return states


def _attention_layers(model: torch.nn.Module, stack: str | None):
    """Per layer, in the order the model's forward runs them: ``(states, norm, output)``: ``states(rows)`` the
    (query, key, value) its attention code computes from ``rows [1, n, d_model]`` (``[heads or K/V heads, n,
    d_head]`` each), the norm that feeds its input or produced it (post-norm; None: none), and its output
    projection. From each modeling file's forward: which norm, which module, and how it is called."""
    base, config = model.base_model, model.config
    model_type = config.model_type
    found = []

    def zeros(rows):  # position 0 for every row
        return torch.zeros(rows.shape[:2], dtype=torch.long)

    if model_type == "falcon":  # FalconDecoderLayer.forward: ln_attn with the new architecture's two norms
        for layer in base.h:
            two = config.new_decoder_architecture and config.num_ln_in_parallel_attn == 2
            attention = layer.self_attention

            def call(rows, a=attention):  # at position 0 FalconModel's rotary embedding turns nothing
                turned = None if config.alibi else base.rotary_emb(rows, position_ids=zeros(rows))
                return a(rows, attention_mask=None, position_embeddings=turned)
            found.append((_handed_states(attention, call), layer.ln_attn if two else layer.input_layernorm,
                          attention.dense))
    elif model_type == "codegen":  # CodeGenBlock.forward: ln_1, then attn (rotary at position 0: nothing turned)
        for block in base.h:

            def call(rows, a=block.attn):
                return a(rows, position_embeddings=base.rotary_emb(rows, zeros(rows)))
            found.append((_handed_states(block.attn, call), block.ln_1, block.attn.out_proj))
    elif model_type == "gpt_bigcode":
        for block in base.h:
            found.append((_handed_states(block.attn, block.attn), block.ln_1, block.attn.c_proj))
    elif model_type == "deberta-v2":  # no attention function: its own transpose_for_scores splits each projection
        layers = list(base.encoder.layer)
        # DebertaV2Encoder.forward: after layer 0 its ConvLayer, whose LayerNorm makes layer 1's input
        norms = [base.embeddings.LayerNorm, base.encoder.conv.LayerNorm] + \
            [each.output.LayerNorm for each in layers[1:-1]]
        for layer, norm in zip(layers, norms, strict=True):
            attention = layer.attention.self

            def states(rows, a=attention):
                with torch.no_grad():
                    return tuple(a.transpose_for_scores(getattr(a, name)(rows), a.num_attention_heads)[None]
                                 for name in ("query_proj", "key_proj", "value_proj"))
            found.append((states, norm, layer.attention.output.dense))
    elif model_type == "albert":  # AlbertTransformer.forward: layer i applies group int(i / (layers / groups))
        previous = None
        for index in range(config.num_hidden_layers):
            group = base.encoder.albert_layer_groups[int(index / (config.num_hidden_layers / config.num_hidden_groups))]
            for layer in group.albert_layers:
                found.append((_handed_states(layer.attention, layer.attention), previous, layer.attention.dense))
                previous = layer.full_layer_layer_norm  # AlbertLayer.forward ends with it
    elif model_type == "t5":  # T5Block.layer[0]: T5LayerSelfAttention, its layer_norm then SelfAttention
        for block in getattr(base, stack).block:
            attention = block.layer[0].SelfAttention
            found.append((_handed_states(attention, attention), block.layer[0].layer_norm, attention.o))
    else:  # the BART family: pre-norm (mBART, Pegasus) self_attn_layer_norm first; post-norm after each sub-layer
        part = getattr(base, stack)
        previous = getattr(part, "layernorm_embedding", None)
        for layer in part.layers:
            attention = layer.self_attn
            pre = model_type in ("mbart", "pegasus")
            found.append((_handed_states(attention, attention), layer.self_attn_layer_norm if pre else previous,
                          attention.out_proj))
            previous = layer.final_layer_norm
    return found


def _handed_maps(model: torch.nn.Module, fold: bool, stack: str | None):
    """:func:`reference_maps` of the families whose attention code is run: per layer, its states on the identity
    (through the norm when folding) less its states at zero (the biases), the K/V heads repeated with transformers'
    own ``repeat_kv`` as the attention function does."""
    out = []
    for states, norm, output in _attention_layers(model, stack):
        d_model = output.out_features
        rows, scale = _norm_rows(norm if fold else None, d_model)
        at_zero = states(torch.zeros(1, 1, d_model, dtype=torch.float64))
        q, k, v = (on - off for on, off in zip(states(rows[None]), at_zero, strict=True))  # [1, heads, d_model, d_head]
        heads = q.shape[1]
        q, k, v = (repeat_kv(part, heads // part.shape[1])[0] * scale for part in (q, k, v))
        merged = torch.eye(output.in_features, dtype=torch.float64)  # one-hot head inputs
        out.append((q, k, v, _linear_map(output, merged).reshape(heads, -1, d_model)))
    return out


def reference_maps(model: torch.nn.Module, family: str, fold: bool, stack: str | None = None):
    """Per layer: (W_Q, W_K, W_V ``[heads, d_model, d_head]``, W_O ``[heads, d_head, d_model]``), derived by running
    the model's own modules (in float64) on identity inputs."""
    model = copy.deepcopy(model).double()
    if model.config.model_type in {"falcon", "codegen", "deberta-v2", "albert", "t5", "bart", "mbart", "marian",
                                   "pegasus"} or (model.config.model_type == "gpt_bigcode" and not
                                                  model.config.multi_query):
        return _handed_maps(model, fold, stack)
    base = model.base_model
    config = model.config
    out = []
    if family == "gpt2":
        for block in base.h:
            attention = block.attn
            d_model, heads = attention.embed_dim, attention.num_heads
            rows, scale = _norm_rows(block.ln_1 if fold else None, d_model)
            # as GPT2Attention.forward: c_attn(x).split(split_size, dim=2), each .view(..., -1, head_dim)
            q, k, v = (part.reshape(d_model, heads, -1).permute(1, 0, 2) * scale
                       for part in _linear_map(attention.c_attn, rows).split(attention.split_size, dim=1))
            o = _linear_map(attention.c_proj, torch.eye(d_model, dtype=torch.float64)).reshape(heads, -1, d_model)
            out.append((q, k, v, o))
    elif family == "llama":
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        for layer in base.layers:
            attention = layer.self_attn
            d_model = config.hidden_size
            rows, scale = _norm_rows(layer.input_layernorm if fold else None, d_model)
            q = _linear_map(attention.q_proj, rows).reshape(d_model, heads, -1).permute(1, 0, 2) * scale
            k, v = (repeat_kv(_linear_map(projection, rows).reshape(d_model, kv_heads, -1).permute(1, 0, 2)[None],
                              heads // kv_heads)[0] * scale for projection in (attention.k_proj, attention.v_proj))
            merged = torch.eye(heads * attention.head_dim, dtype=torch.float64)  # one-hot head inputs
            o = _linear_map(attention.o_proj, merged).reshape(heads, -1, d_model)
            out.append((q, k, v, o))
    elif family == "bert":
        layers = list(base.encoder.layer)
        norms = [base.embeddings.LayerNorm] + [layer.output.LayerNorm for layer in layers[:-1]]
        for layer, norm in zip(layers, norms, strict=True):
            attention = layer.attention.self
            d_model, heads = config.hidden_size, attention.num_attention_heads
            rows, scale = _norm_rows(norm if fold else None, d_model)
            q, k, v = (_linear_map(getattr(attention, name), rows).reshape(d_model, heads, -1).permute(1, 0, 2)
                       * scale for name in ("query", "key", "value"))
            o = _linear_map(layer.attention.output.dense, torch.eye(d_model, dtype=torch.float64))
            out.append((q, k, v, o.reshape(heads, -1, d_model)))
    elif family == "linear":  # each layer's attention: q_proj, k_proj, v_proj, then out_proj / o_proj
        heads = getattr(config, "num_attention_heads", None) or config.n_head
        d_model = getattr(config, "hidden_size", None) or config.n_embd
        blocks = base.decoder.layers if hasattr(base, "decoder") else base.encoder.layer if hasattr(base, "encoder") \
            else base.h if hasattr(base, "h") else\
            base.blocks if hasattr(base, "blocks") else base.transformer.layer if hasattr(base, "transformer") \
            else base.layers
        for block in blocks:
            attention = getattr(block, "self_attn", None) or getattr(block, "attn", None) or block.attention
            attention = getattr(attention, "attention", attention)  # GPT-Neo: attn.attention
            attention = getattr(attention, "attn", attention)  # MPNet: attention.attn (q, k, v, o)
            norm = next((getattr(block, name) for name in ("input_layernorm", "ln_1", "self_attn_layer_norm",
                                                           "norm_1") if hasattr(block, name)), None)
            rows, scale = _norm_rows(norm if fold else None, d_model)
            output = getattr(attention, "o_proj", None) or getattr(attention, "out_proj", None) or \
                getattr(attention, "out_lin", None) or getattr(attention, "o", None) or attention.c_proj
            if hasattr(attention, "q_proj") or hasattr(attention, "q_lin") or hasattr(attention, "q"):
                names = ("q_proj", "k_proj", "v_proj") if hasattr(attention, "q_proj") else \
                    ("q_lin", "k_lin", "v_lin") if hasattr(attention, "q_lin") else ("q", "k", "v")
                q_map, k_map, v_map = (_linear_map(getattr(attention, name), rows) for name in names)
            else:  # as each model's forward splits its fused projection's output
                fused = getattr(attention, "qkv_proj", None) or getattr(attention, "Wqkv", None) or attention.c_attn
                mapped = _linear_map(fused, rows)  # [d_model, q_dim + 2 * kv_dim]
                if config.model_type == "mpt":
                    q_map, k_map, v_map = mapped.chunk(3, dim=-1)
                elif config.model_type == "gpt_bigcode":
                    q_map, k_map, v_map = mapped.split((d_model, attention.kv_dim, attention.kv_dim), dim=-1)
                else:  # Phi-3: [:query_pos], then num_key_value_heads * head_dim each
                    query_pos = heads * attention.head_dim
                    kv = (mapped.shape[-1] - query_pos) // 2
                    q_map, k_map, v_map = mapped[:, :query_pos], mapped[:, query_pos:query_pos + kv], \
                        mapped[:, query_pos + kv:]
            kv_heads = k_map.shape[-1] // (q_map.shape[-1] // heads)
            q = q_map.reshape(d_model, heads, -1).permute(1, 0, 2) * scale
            k, v = (repeat_kv(part.reshape(d_model, kv_heads, -1).permute(1, 0, 2)[None], heads // kv_heads)[0]
                    * scale for part in (k_map, v_map))
            merged = torch.eye(output.in_features, dtype=torch.float64)  # one-hot head inputs
            out.append((q, k, v, _linear_map(output, merged).reshape(heads, -1, d_model)))
    else:  # gpt_neox: as GPTNeoXAttention.forward, .view(..., -1, 3 * head_size) then .chunk(3, dim=-1); BLOOM's
        # _reshape: .view(..., heads, 3, head_dim), the same layout
        heads = config.num_attention_heads if config.model_type == "gpt_neox" else config.n_head
        for layer in (base.layers if config.model_type == "gpt_neox" else base.h):
            attention = getattr(layer, "attention", None) or layer.self_attention
            d_model = config.hidden_size
            rows, scale = _norm_rows(layer.input_layernorm if fold else None, d_model)
            head_size = d_model // heads
            qkv = _linear_map(attention.query_key_value, rows).reshape(d_model, heads, 3 * head_size)
            q, k, v = (part.permute(1, 0, 2) * scale for part in qkv.chunk(3, dim=-1))
            o = _linear_map(attention.dense, torch.eye(d_model, dtype=torch.float64)).reshape(heads, -1, d_model)
            out.append((q, k, v, o))
    return out


def reference_scores(maps, kind: str) -> torch.Tensor:
    """TransformerLens's all_composition_scores with dense matrices: left = the sender's OV, right = the receiver's
    QK (Q), QK^T (K) or OV (V); NaN where the receiver's layer is not after the sender's."""
    layers, heads = len(maps), maps[0][0].shape[0]
    q, k, v, o = (torch.stack([layer[index] for layer in maps]) for index in range(4))  # [layers, heads, ...]
    ov = (v @ o).flatten(0, 1)  # [layers * heads, d_model, d_model]
    qk = (q @ k.transpose(-1, -2)).flatten(0, 1)
    right = {"Q": qk, "K": qk.transpose(-1, -2), "V": ov}[kind]
    product = ov[:, None] @ right[None]  # [senders, receivers, d_model, d_model]
    scores = torch.linalg.matrix_norm(product) / (torch.linalg.matrix_norm(ov)[:, None]
                                                  * torch.linalg.matrix_norm(right)[None, :])
    layer = torch.arange(layers).repeat_interleave(heads)
    scores = torch.where(layer[None, :] > layer[:, None], scores, torch.nan)
    return scores.reshape(layers, heads, layers, heads)


FAMILY_OF = {"distilbert": "linear", "phi3": "linear", "mpt": "linear", "gpt_bigcode": "linear", "gpt_neo": "linear",
             "bloom": "gpt_neox",
             "electra": "bert", "opt": "linear", "gptj": "linear", "mpnet": "linear", "olmo": "linear",
             "gemma": "linear",
             "gpt2": "gpt2", "llama": "llama", "qwen2": "llama", "mistral": "llama", "bert": "bert",
             "gpt_neox": "gpt_neox", **OTHER_FAMILIES}


@pytest.mark.parametrize("fold", [False, True], ids=["raw", "folded"])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_weights_and_scores_match_the_functional_reference(name, fold):
    model = built(name)
    family, stack = FAMILY_OF[name], STACK_OF.get(name)
    if fold and name in NOTHING_TO_FOLD:  # post-norm, and no norm before the first layer's attention
        with pytest.raises(ValueError, match="pass fold_norm=False"):
            composition.head_weights(model, fold_norm=True)
        return
    weights = composition.head_weights(model, fold_norm=fold, stack=stack)
    assert weights.family == family and weights.folded == fold and weights.stack == (stack or "")
    maps = reference_maps(model, family, fold, stack)
    assert len(maps) == weights.layers
    for layer, (q, k, v, o) in enumerate(maps):
        for mine, theirs in zip((weights.W_Q, weights.W_K, weights.W_V, weights.W_O), (q, k, v, o), strict=True):
            torch.testing.assert_close(mine[layer].double(), theirs, rtol=RTOL, atol=1e-6)
    # the scores are computed alike for every family: the later families (CI's time) check one kind each, in turn
    kinds = composition.KINDS if name not in OTHER_FAMILIES else \
        composition.KINDS[list(OTHER_FAMILIES).index(name) % 3]
    for kind in kinds:
        result = composition.composition_scores(weights, kind)
        torch.testing.assert_close(result.scores, reference_scores(maps, kind), rtol=RTOL, atol=0, equal_nan=True)


def test_default_folds_pre_norm_models_only():
    assert composition.head_weights(built("gpt2")).folded
    assert composition.head_weights(built("llama")).folded
    assert composition.head_weights(built("gpt_neox")).folded
    assert not composition.head_weights(built("bert")).folded
    # the gains matter: the roughened gains change the scores
    folded = composition.composition_scores(built("gpt2"), "K").scores
    raw = composition.composition_scores(built("gpt2"), "K", fold_norm=False).scores
    assert not torch.allclose(folded, raw, equal_nan=True)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "gpt_neox"])
def test_scores_lie_in_0_1_with_nan_exactly_where_no_pair(name):
    for kind in composition.KINDS:
        result = composition.composition_scores(built(name), kind)
        layers, heads = result.layers, result.heads
        sender = torch.arange(layers)[:, None, None, None].expand(layers, heads, layers, heads)
        receiver = torch.arange(layers)[None, None, :, None].expand(layers, heads, layers, heads)
        assert torch.equal(torch.isnan(result.scores), receiver <= sender)
        finite = result.scores[torch.isfinite(result.scores)]
        assert finite.numel() == heads * heads * layers * (layers - 1) // 2
        assert float(finite.min()) >= 0 and float(finite.max()) <= 1
        assert result.labels[:2] == ["L0 H0", "L0 H1"] and len(result.labels) == layers * heads


def test_grouped_query_heads_share_their_kv_head():
    model = copy.deepcopy(built("llama"))
    weights = composition.head_weights(model, fold_norm=False)
    assert weights.kv_heads == 2 and [weights.kv_group(head) for head in range(4)] == [0, 0, 1, 1]
    for shared in (weights.W_K, weights.W_V):
        assert torch.equal(shared[:, 0], shared[:, 1]) and torch.equal(shared[:, 2], shared[:, 3])
        assert not torch.equal(shared[:, 1], shared[:, 2])
    # TransformerLens's K- and V-scores also hold each query head's own W_Q (K) and W_O (V): heads of a group do
    # not score the same by construction...
    k_scores = composition.composition_scores(weights, "K").scores
    assert not torch.allclose(k_scores[0, :, 1, 0], k_scores[0, :, 1, 1])
    # ...but they do once those are made equal too, and only for heads that really share a K/V head
    attention = model.model.layers[1].self_attn
    d_head = attention.head_dim
    with torch.no_grad():
        for head in (1, 2):
            attention.q_proj.weight[head * d_head:(head + 1) * d_head] = attention.q_proj.weight[:d_head]
            attention.o_proj.weight[:, head * d_head:(head + 1) * d_head] = attention.o_proj.weight[:, :d_head]
    for kind in ("K", "V"):
        scores = composition.composition_scores(model, kind).scores[0, :, 1]  # [sender head, receiver head]
        torch.testing.assert_close(scores[:, 0], scores[:, 1], rtol=1e-12, atol=0)
        assert not torch.allclose(scores[:, 0], scores[:, 2])  # head 2 reads another K/V head


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_scaling_a_head_changes_no_score(name):
    model = copy.deepcopy(built(name))
    before = {kind: composition.composition_scores(model, kind).scores for kind in composition.KINDS}
    with torch.no_grad():
        if name == "gpt2":
            attention = model.transformer.h[0].attn
            d_head = attention.head_dim
            attention.c_proj.weight[d_head:2 * d_head] *= 3  # head 1's W_O (Conv1D: [in, out])
            model.transformer.h[1].attn.c_attn.weight[:, :d_head] *= 3  # layer 1 head 0's W_Q
        else:
            attention = model.model.layers[0].self_attn
            d_head = attention.head_dim
            attention.o_proj.weight[:, d_head:2 * d_head] *= 3  # head 1's W_O
            model.model.layers[1].self_attn.q_proj.weight[:d_head] *= 3
    for kind in composition.KINDS:
        after = composition.composition_scores(model, kind).scores
        # float32 weights times 3 round: the scores agree to float32's precision
        torch.testing.assert_close(after, before[kind], rtol=1e-6, atol=0, equal_nan=True)


def test_a_rank_deficient_head_is_scored_exactly():
    model = copy.deepcopy(built("gpt2"))
    attention = model.transformer.h[0].attn
    d_model, d_head = attention.embed_dim, attention.head_dim
    with torch.no_grad():  # head 2's values use half their dimensions; head 3's queries repeat one column
        attention.c_attn.weight[:, 2 * d_model + 2 * d_head:2 * d_model + 2 * d_head + d_head // 2] = 0
        attention.c_attn.weight[:, 3 * d_head:4 * d_head] = attention.c_attn.weight[:, 3 * d_head:3 * d_head + 1]
    maps = reference_maps(model, "gpt2", True)
    for kind in composition.KINDS:
        torch.testing.assert_close(composition.composition_scores(model, kind).scores, reference_scores(maps, kind),
                                   rtol=RTOL, atol=0, equal_nan=True)


def test_the_baseline_is_what_gaussian_matrices_score():
    for kind in composition.KINDS:
        mean, spread = composition.random_baseline(128, 32, kind, draws=50, seed=0)
        assert mean == pytest.approx(1 / math.sqrt(128), rel=0.05)  # about 1/sqrt(d_model)
        assert 0 < spread < 0.1 * mean
        assert composition.random_baseline(128, 32, kind, draws=50, seed=0) == (mean, spread)
    assert composition.random_baseline(64, 16, "K", seed=1) != composition.random_baseline(64, 16, "K", seed=2)


def test_random_weights_are_flat_and_a_trained_model_is_not():
    for kind in composition.KINDS:
        result = composition.composition_scores(built("llama"), kind, fold_norm=False)  # Gaussian init
        assert result.flat, kind
        assert composition.composition_words(result)[0].startswith("Nearly flat")
    trained = composition.composition_scores(tiny_gpt2_unroughened(), "K")
    assert not trained.flat
    top = trained.strongest(1)[0]
    assert top[3] > trained.flat_threshold and top[2] == float(trained.scores.nan_to_num(-1).max())
    words = composition.composition_words(trained)
    assert "spreads above" in words[0] and "Nearly flat" not in " ".join(words)
    torch.testing.assert_close(trained.spreads_above(), (trained.scores - trained.baseline_mean)
                               / trained.baseline_spread, equal_nan=True)


def tiny_gpt2_unroughened():
    return transformers.AutoModelForCausalLM.from_pretrained(BUNDLED_GPT_DIR, attn_implementation="eager")


def test_the_words_say_what_is_not_comparable():
    llama = composition.composition_scores(built("llama"), "Q")
    said = " ".join(composition.composition_words(llama))
    assert "RoPE" in said and "offset 0" in said and "share one K/V head" in said and "RMSNorm" in said
    neox = composition.composition_scores(built("gpt_neox"), "K")
    assert neox.weights.positions == "rotary" and neox.weights.rotary_fraction == 0.25
    assert "25% of each head's dimensions" in " ".join(composition.composition_words(neox))
    gpt2 = " ".join(composition.composition_words(composition.composition_scores(built("gpt2"), "V")))
    assert "RoPE" not in gpt2 and "K/V head" not in gpt2 and "centred" in gpt2
    bert = " ".join(composition.composition_words(composition.composition_scores(built("bert"), "K")))
    assert "not folded" in bert and "Post-norm" in bert
    alibi = dataclasses.replace(llama.weights, positions="alibi", rotary_fraction=0.0)
    said = " ".join(composition.composition_words(composition.composition_scores(alibi, "K")))
    assert "ALiBi" in said and "RoPE" not in said


@pytest.mark.parametrize("name", ["qwen3", "gemma3_text"])
def test_queries_and_keys_normalised_per_head_fold_their_gains_and_say_so(name):
    """Qwen3 (RMSNorm: weight) and Gemma 3 (1 + weight) normalise each head's queries and keys. By hand: the model's
    own q_norm on each row of q_proj applied to the identity, times that row's RMS (undoing the per-token scale),
    is the gain-folded W_Q; the same for keys. MPT's qk_ln, one norm over every head together, stays refused."""
    torch.manual_seed(0)
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, vocab_size=40)
    config = transformers.Qwen3Config(**shape) if name == "qwen3" else transformers.Gemma3TextConfig(**shape)
    model = transformers.AutoModelForCausalLM.from_config(config).double()
    with torch.no_grad():
        for module in model.modules():
            if module is not model and hasattr(module, "weight") and "Norm" in type(module).__name__:
                module.weight.copy_(0.5 + torch.rand_like(module.weight))
    weights = composition.head_weights(model, fold_norm=False, dtype=torch.float64)
    eye = torch.eye(32, dtype=torch.float64)
    for layer, block in enumerate(model.model.layers):
        attention = block.self_attn
        for projection, norm, found, heads in ((attention.q_proj, attention.q_norm, weights.W_Q[layer], 4),
                                               (attention.k_proj, attention.k_norm, weights.W_K[layer][::2], 2)):
            with torch.no_grad():
                rows = projection(eye).view(32, heads, 8)  # [d_model, heads, d_head]
                rms = (rows.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon if hasattr(
                    norm, "variance_epsilon") else rows.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
                expected = (norm(rows) * rms).permute(1, 0, 2)  # [heads, d_model, d_head]
            torch.testing.assert_close(found, expected, atol=1e-6, rtol=1e-6)  # the norms compute in float32
    assert weights.per_head_norms
    said = " ".join(composition.composition_words(composition.composition_scores(weights, "K")))
    assert "q_norm, k_norm" in said and "per-token scale" in said
    mpt = transformers.MptConfig(d_model=32, n_layers=2, n_heads=4, vocab_size=40, attn_config={"qk_ln": True})
    with pytest.raises(ValueError, match="qk_ln"):
        composition.head_weights(transformers.MptForCausalLM(mpt))


def test_an_architecture_it_does_not_read_is_refused_in_words():
    # DeBERTa (v1): one fused in_proj with separate q and v biases, a layout no reader knows
    config = transformers.DebertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, vocab_size=40, max_position_embeddings=64)
    with pytest.raises(ValueError, match="cannot read the attention weights of 'deberta' models.*gpt2"):
        composition.head_weights(transformers.DebertaModel(config))
    # an encoder-decoder with q_proj, k_proj, v_proj that is not of the BART family's known types
    config = transformers.BlenderbotSmallConfig(d_model=32, encoder_layers=1, decoder_layers=1, vocab_size=40,
                                                encoder_attention_heads=4, decoder_attention_heads=4,
                                                encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)
    with pytest.raises(ValueError, match="this blenderbot-small model is another encoder-decoder"):
        composition.head_weights(transformers.BlenderbotSmallModel(config))
    with pytest.raises(ValueError, match="cross-attention is not read"):
        composition.head_weights(built("t5"), stack="cross")
    with pytest.raises(ValueError, match="has one stack"):
        composition.head_weights(built("gpt2"), stack="decoder")
    with pytest.raises(ValueError, match="Linear without a transformers config"):
        composition.composition_scores(torch.nn.Linear(2, 2), "Q")
    with pytest.raises(ValueError, match="one of Q, K, V"):
        composition.composition_scores(built("gpt2"), "O")


def test_the_app_loader_gives_the_same_scores_with_progress():
    from attnviz.interventions.edits import editable_lm

    model, _ = editable_lm(BUNDLED_GPT_DIR)
    heard = []
    result = composition.composition_scores(model, "K", progress=lambda share, words: heard.append(share))
    torch.testing.assert_close(result.scores, composition.composition_scores(tiny_gpt2_unroughened(), "K").scores,
                               rtol=1e-12, atol=0, equal_nan=True)
    assert heard[-1] == 1.0 and len(heard) == result.layers - 1
    both = composition.all_composition_scores(model)
    assert list(both) == ["Q", "K", "V"] and torch.equal(both["K"].scores.nan_to_num(), result.scores.nan_to_num())
    rows = composition.scores_table(result)
    assert len(rows) == result.pairs and rows[0]["score"] == max(row["score"] for row in rows)


def test_the_figures():
    result = composition.composition_scores(built("gpt2"), "K")
    figure = composition_viz.composition_heatmap(result.scores, result.labels, kind="K",
                                                 baseline_mean=result.baseline_mean,
                                                 baseline_spread=result.baseline_spread)
    heatmap = figure.data[0]
    z = np.asarray(heatmap.z, dtype=float)
    assert z.shape == (12, 12) and np.isnan(z[4, 0]) and np.isfinite(z[0, 4])
    assert heatmap.zmid == pytest.approx(result.baseline_mean)
    assert list(figure.layout.xaxis.tickvals) == list(range(12)) and figure.layout.yaxis.ticktext[5] == "L1 H1"
    assert "K-composition" in figure.layout.title.text and "baseline" in figure.layout.title.text
    assert "spreads above the baseline" in heatmap.hovertext[0][4]
    spreads = composition_viz.composition_heatmap(result.scores, result.labels, kind="K", measure="spreads",
                                                  baseline_mean=result.baseline_mean,
                                                  baseline_spread=result.baseline_spread)
    assert spreads.data[0].zmid == 0
    pooled = composition_viz.composition_heatmap(result.scores, result.labels, kind="K", max_heads=8,
                                                 baseline_mean=result.baseline_mean,
                                                 baseline_spread=result.baseline_spread)
    z = np.asarray(pooled.data[0].z, dtype=float)
    assert z.shape == (3, 3) and z[0, 1] == pytest.approx(float(np.nanmax(result.scores[0, :, 1].numpy())))
    assert "strongest pair" in pooled.layout.title.text and "→" in pooled.data[0].hovertext[0][1]
    histogram = composition_viz.composition_distribution(result.scores, kind="K", threshold=result.flat_threshold,
                                                         baseline_mean=result.baseline_mean,
                                                         baseline_spread=result.baseline_spread)
    assert len(histogram.data[0].x) == result.pairs and "48 head pairs" in histogram.layout.title.text


def test_bloom_is_said_to_add_alibi():
    weights = composition.head_weights(built("bloom"))
    assert weights.positions == "alibi"
    assert any("ALiBi" in said for said in composition.composition_words(composition.composition_scores(weights, "K")))


def _said(name: str, kind: str = "K", **options) -> tuple[composition.HeadWeights, str]:
    weights = composition.head_weights(built(name), stack=STACK_OF.get(name), **options)
    return weights, " ".join(composition.composition_words(composition.composition_scores(weights, kind)))


def test_the_other_families_state_their_facts_in_words():
    # Falcon: grouped K/V heads (2 of 4), multi-query (1), RoPE or ALiBi from the config, pre-norm
    weights, said = _said("falcon")
    assert (weights.kv_heads, weights.positions, weights.rotary_fraction, weights.pre_norm, weights.norm) == \
        (2, "rotary", 1.0, True, "LayerNorm")
    assert "RoPE" in said and "every 2 query heads share one K/V head" in said
    weights, said = _said("falcon_mq")
    assert weights.kv_heads == 1 and "every 4 query heads share one K/V head" in said
    weights, said = _said("falcon_alibi")
    assert (weights.kv_heads, weights.positions) == (4, "alibi") and "ALiBi" in said and "RoPE" not in said
    # CodeGen: RoPE on its first rotary_dim = 4 of 8 dimensions per head
    weights, said = _said("codegen", "Q")
    assert (weights.positions, weights.rotary_fraction) == ("rotary", 0.5) and "50% of each head's dimensions" in said
    weights, said = _said("gpt_bigcode_mha")
    assert (weights.family, weights.kv_heads, weights.positions) == ("linear", 4, "learned absolute")
    # DeBERTa: the content-to-content weights, its relative-position terms said to be left out; post-norm
    weights, said = _said("deberta-v2")
    assert weights.positions == "disentangled relative" and not weights.pre_norm and not weights.folded
    assert "content-to-position" in said and "leave the relative-position terms out" in said and "Post-norm" in said
    # T5: its relative bias, RMS norm (T5LayerNorm) folded, encoder or decoder self-attention
    weights, said = _said("t5")
    assert (weights.positions, weights.norm, weights.folded, weights.stack, weights.layers, weights.d_head) == \
        ("relative bias", "RMSNorm", True, "encoder", 2, 16)
    assert "relative position bias" in said and "encoder's self-attention heads only" in said and "centred" not in said
    weights, said = _said("t5_decoder")
    assert weights.stack == "decoder" and weights.layers == 3 and "decoder's self-attention heads only" in said
    assert "Cross-attention is left out" in said
    # the BART family: post-norm BART and Marian, pre-norm mBART and Pegasus; learned or sinusoidal tables
    weights, said = _said("bart")
    assert (weights.pre_norm, weights.folded, weights.positions) == (False, False, "learned absolute")
    assert "Post-norm" in said and "encoder's self-attention heads only" in said
    assert composition.head_weights(built("bart")).layers == 2  # the encoder by default
    assert (_said("mbart")[0].pre_norm, _said("mbart")[0].folded) == (True, True)
    assert _said("marian")[0].positions == _said("pegasus")[0].positions == "sinusoidal absolute"


def test_albert_reads_its_shared_layers_once_per_layer_and_says_so():
    weights, said = _said("albert")
    assert weights.layers == 3 and weights.shared_weights == (0, 0, 0) and not weights.pre_norm
    assert torch.equal(weights.W_Q[0], weights.W_Q[2]) and torch.equal(weights.W_O[1], weights.W_O[2])
    assert "its 3 layers all apply the same matrices" in said and "with themselves" in said
    # 4 layers in 2 groups of 2 inner layers: 8 attentions, in the order AlbertTransformer applies them
    weights, said = _said("albert_groups")
    assert weights.layers == 8 and weights.shared_weights == (0, 1, 0, 1, 2, 3, 2, 3)
    assert torch.equal(weights.W_K[1], weights.W_K[3]) and not torch.equal(weights.W_K[1], weights.W_K[5])
    assert "apply 4 sets of matrices" in said
    with pytest.raises(ValueError, match="embedding_hidden_mapping_in.*pass fold_norm=False"):
        composition.head_weights(built("albert"), fold_norm=True)
