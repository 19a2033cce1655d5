"""Every self-attention head's weight matrices, read as transformers' own attention code splits them: W_Q, W_K, W_V
``[d_model, d_head]`` and W_O ``[d_head, d_model]`` per layer and query head (a grouped-query head gets the K/V head it
shares), in the row-vector convention, with the norm's gain that feeds each attention folded in where asked, and the
facts that decide what products of them mean (positions, grouped K/V heads, shared layers, which stack). What
:mod:`attnviz.interventions.composition` scores.

One reader per layout: GPT-2's fused ``c_attn``; the Llama family's ``q_proj``/``k_proj``/``v_proj``/``o_proj``;
BERT's ``query``/``key``/``value``; GPT-NeoX's and BLOOM's per-head interleaved ``query_key_value``; Falcon's
``query_key_value`` in its three layouts (grouped K/V heads under ``new_decoder_architecture``, multi-query, per-head
interleaved); CodeGen's ``qkv_proj`` interleaved across its four model-parallel shards (in the order q, v, k);
DeBERTa-v2's ``query_proj``/``key_proj``/``value_proj`` (the content-to-content weights: its relative-position
terms are not weights of this form, and are left out); ALBERT's one shared layer (or groups of layers), read once
per layer it serves; the encoder's self-attention stack of T5 (``SelfAttention.q/k/v/o``) and of BART, mBART,
Marian and Pegasus (``self_attn``), or, asked with ``stack="decoder"``, the decoder's (cross-attention never: it is
no composition between heads of one residual stream); and a generic reader for any other model whose attention has
separate q/k/v layers or one projection holding q, k and v (in blocks; GPT-BigCode's ``c_attn`` without multi-query
attention interleaved per head). Biases are ignored. Checked for each family against transformers 5.25, and in the
tests against the model's own attention code run on an identity matrix.

Imports torch and attnviz.interventions.anatomy (a norm's gain, read by calling it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.interventions.anatomy import NotReadable, frozen_norm

# model_type -> the reader that knows its layout (checked against transformers 5.25's modeling code)
LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe")
BERT_LIKE = ("bert", "roberta", "xlm-roberta", "electra")
# BART's layout: post-norm (BART, Marian: a LayerNorm after each sub-layer) or pre-norm (mBART, Pegasus)
BART_LIKE = {"bart": False, "marian": False, "mbart": True, "pegasus": True}  # model_type -> pre-norm
FAMILIES = {"gpt2": "gpt2", "gpt_neox": "gpt_neox", "bloom": "gpt_neox", **{name: "llama" for name in LLAMA_LIKE},
            **{name: "bert" for name in BERT_LIKE}, "falcon": "falcon", "codegen": "codegen",
            "deberta-v2": "deberta", "albert": "albert", "t5": "t5", **{name: "bart" for name in BART_LIKE}}
# the families with an encoder and a decoder, each its own residual stream: one stack's self-attention is read
ENCODER_DECODER_FAMILIES = ("t5", "bart")
STACKS = ("encoder", "decoder")


@dataclass
class HeadWeights:
    """Every self-attention head's four projection matrices, stacked by layer and query head, in the row-vector
    convention (``x @ W_Q`` is the head's query), with the facts about the model that decide what the products of
    these matrices mean (positions, grouped K/V heads, whether a norm's gain was folded in)."""

    W_Q: torch.Tensor  # [layers, heads, d_model, d_head]
    W_K: torch.Tensor  # [layers, heads, d_model, d_head]: under GQA the shared K/V head's, repeated per query head
    W_V: torch.Tensor  # [layers, heads, d_model, d_head]
    W_O: torch.Tensor  # [layers, heads, d_head, d_model]
    model_type: str
    family: str  # the reader used: "gpt2", "llama", "bert", "gpt_neox", "falcon", "codegen", "deberta", "albert",
    #              "t5", "bart" or "linear"
    kv_heads: int  # K/V heads per layer (= heads without grouped-query attention)
    pre_norm: bool  # a norm sits between the residual stream and each attention's input
    norm: str  # the norm that feeds each attention: "LayerNorm" or "RMSNorm" (T5's T5LayerNorm), "none" for none
    folded: bool  # the norm's gain (and, for LayerNorm, its centring) is folded into W_Q, W_K, W_V
    # "learned absolute", "sinusoidal absolute", "rotary", "alibi", "relative bias" (T5's learned bias by bucketed
    # distance, added to the scores) or "disentangled relative" (DeBERTa's content-to-position and
    # position-to-content terms, added to the scores): the last two are not in W_Q W_K^T
    positions: str
    rotary_fraction: float  # the share of each head's query/key dimensions that RoPE rotates (0 without RoPE)
    # an encoder-decoder: whose self-attention heads these are, "encoder" or "decoder" (cross-attention is never
    # read); "" for a model of one stack
    stack: str = ""
    # layers that share their weights (ALBERT): per layer, the set of weights it applies (layers with the same number
    # hold the same matrices); () where every layer has its own
    shared_weights: tuple[int, ...] = ()

    @property
    def layers(self) -> int:
        return self.W_Q.shape[0]

    @property
    def heads(self) -> int:
        return self.W_Q.shape[1]

    @property
    def d_model(self) -> int:
        return self.W_Q.shape[2]

    @property
    def d_head(self) -> int:
        return self.W_Q.shape[3]

    @property
    def labels(self) -> list[str]:
        """``"L0 H1"`` for every head, layer by layer (the order of a flattened ``[layers, heads]``)."""
        return [f"L{layer} H{head}" for layer in range(self.layers) for head in range(self.heads)]

    def kv_group(self, head: int) -> int:
        """The K/V head that query ``head`` reads keys and values from (transformers' ``repeat_kv``)."""
        return head // (self.heads // self.kv_heads)


def family_of(model: torch.nn.Module) -> str:
    """The reader for ``model`` ("gpt2", "llama", "bert", "gpt_neox", "falcon", "codegen", "deberta", "albert",
    "t5", "bart", or "linear": any other model whose attention has separate q_proj, k_proj and v_proj layers or one
    q|k|v projection), or a ValueError that names what is read."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type in FAMILIES:
        if getattr(config, "is_encoder_decoder", False) and FAMILIES[model_type] not in ENCODER_DECODER_FAMILIES:
            raise ValueError(f"composition scores read decoder-only or encoder-only models; this {model_type} model "
                             "is an encoder-decoder")
        return FAMILIES[model_type]
    if model_type and _linear_layers(model) is not None:
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError(f"composition scores read decoder-only or encoder-only models, and the encoder-decoders "
                             f"{', '.join(sorted(n for n, f in FAMILIES.items() if f in ENCODER_DECODER_FAMILIES))}; "
                             f"this {model_type} model is another encoder-decoder")
        return "linear"
    supported = ", ".join(sorted(FAMILIES)) + " and any decoder whose attention has q_proj, k_proj, v_proj"
    shown = f"'{model_type}'" if model_type else f"a {type(model).__name__} without a transformers config"
    raise ValueError(f"composition scores cannot read the attention weights of {shown} models yet: the heads' "
                     f"projections are laid out differently in each family, and these are the ones read: "
                     f"{supported}")


def _linear_heads(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """An ``nn.Linear`` projection's weight ``[heads * d_head, d_model]`` as ``[heads, d_model, d_head]``: its
    output features are head-major, as ``.view(..., heads, d_head)`` in the attention code splits them."""
    return weight.reshape(heads, -1, weight.shape[-1]).transpose(1, 2)  # [heads, d_model, d_head]


def _linear_output_heads(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """An ``nn.Linear`` output projection's weight ``[d_model, heads * d_head]`` as ``[heads, d_head, d_model]``."""
    return weight.t().reshape(heads, -1, weight.shape[0])  # [heads, d_head, d_model]


def _read_gpt2(block: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    # GPT2Attention: c_attn is a Conv1D (weight [d_model, 3 * d_model], y = x @ W + b), split into q, k, v along
    # its output, each viewed as (heads, d_head); c_proj (weight [d_model, d_model]) reads the heads concatenated
    attention = block.attn
    if getattr(attention, "is_cross_attention", False):
        raise ValueError("composition scores read self-attention; this GPT-2 block is cross-attention")
    heads, d_model = attention.num_heads, attention.embed_dim
    weight = attention.c_attn.weight  # [d_model, 3 * d_model]
    q, k, v = (weight[:, part * d_model:(part + 1) * d_model].reshape(d_model, heads, -1).transpose(0, 1)
               for part in range(3))  # each [heads, d_model, d_head]
    o = attention.c_proj.weight.reshape(heads, -1, d_model)  # [heads, d_head, d_model]
    return q, k, v, o


def _read_llama(layer: torch.nn.Module, heads: int, kv_heads: int) -> tuple[torch.Tensor, ...]:
    # LlamaAttention (and Mistral's, Mixtral's, Qwen2's): q_proj [heads * d_head, d_model], k_proj and v_proj
    # [kv_heads * d_head, d_model], each output viewed as (heads, d_head); repeat_kv hands K/V head h // n_rep to
    # query head h; o_proj [d_model, heads * d_head]
    attention = layer.self_attn
    q = _linear_heads(attention.q_proj.weight, heads)  # [heads, d_model, d_head]
    k = _linear_heads(attention.k_proj.weight, kv_heads)  # [kv_heads, d_model, d_head]
    v = _linear_heads(attention.v_proj.weight, kv_heads)
    repeats = heads // kv_heads
    k, v = k.repeat_interleave(repeats, dim=0), v.repeat_interleave(repeats, dim=0)  # [heads, d_model, d_head]
    o = _linear_output_heads(attention.o_proj.weight, heads)  # [heads, d_head, d_model]
    return q, k, v, o


def _read_bert(layer: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    # BertSelfAttention (RoBERTa's the same): query, key, value [heads * d_head, d_model], viewed as (heads,
    # d_head); BertSelfOutput.dense [d_model, heads * d_head] reads the heads concatenated (before its LayerNorm)
    attention = layer.attention.self
    heads = attention.num_attention_heads
    q, k, v = (_linear_heads(getattr(attention, name).weight, heads) for name in ("query", "key", "value"))
    o = _linear_output_heads(layer.attention.output.dense.weight, heads)  # [heads, d_head, d_model]
    return q, k, v, o


def _read_gpt_neox(layer: torch.nn.Module, heads: int) -> tuple[torch.Tensor, ...]:
    # GPTNeoXAttention: query_key_value [3 * d_model, d_model]; its output is viewed as (heads, 3 * d_head) and
    # chunked into q, k, v inside each head (interleaved per head, not q|k|v blocks); dense [d_model, d_model].
    # BloomAttention (self_attention) the same: .view(..., heads, 3, head_dim)
    attention = getattr(layer, "attention", None) or layer.self_attention
    weight = attention.query_key_value.weight  # [3 * d_model, d_model]
    d_model = weight.shape[1]
    per_head = weight.reshape(heads, 3, -1, d_model)  # [heads, (q, k, v), d_head, d_model]
    q, k, v = (per_head[:, part].transpose(1, 2) for part in range(3))  # each [heads, d_model, d_head]
    o = _linear_output_heads(attention.dense.weight, heads)  # [heads, d_head, d_model]
    return q, k, v, o


def _repeat_kv(k: torch.Tensor, v: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V heads ``[kv_heads, ...]`` repeated for the query heads that share them (``repeat_kv``: query head h reads
    K/V head h // (heads // kv_heads))."""
    repeats = heads // k.shape[0]
    return k.repeat_interleave(repeats, dim=0), v.repeat_interleave(repeats, dim=0)


def _read_falcon(layer: torch.nn.Module) -> tuple[tuple[torch.Tensor, ...], int]:
    # FalconAttention.forward (older transformers' _split_heads: the same three layouts): query_key_value's output
    # is viewed as (-1, head_dim), then by the config's layout: new_decoder_architecture: (kv_heads, heads per group
    # + 2, head_dim), each group's query heads, then its key, then its value (the group's query heads read them);
    # multi_query: the heads' queries, then one key, one value; else (heads, 3, head_dim), each head's query, key,
    # value in turn. dense [d_model, d_model]
    attention = layer.self_attention
    heads, d_head = attention.num_heads, attention.head_dim
    weight = attention.query_key_value.weight  # [(heads + 2 * kv_heads) * d_head, d_model]
    d_model = weight.shape[1]
    rows = weight.reshape(-1, d_head, d_model)  # [heads + 2 * kv_heads, d_head, d_model]
    if attention.new_decoder_architecture:
        grouped = rows.reshape(attention.num_kv_heads, -1, d_head, d_model)  # [kv_heads, group + 2, d_head, d_model]
        q, k, v = grouped[:, :-2].reshape(heads, d_head, d_model), grouped[:, -2], grouped[:, -1]
    elif attention.multi_query:
        q, k, v = rows.split((heads, 1, 1), dim=0)
    else:
        q, k, v = rows.reshape(heads, 3, d_head, d_model).unbind(1)
    q, k, v = (part.transpose(1, 2) for part in (q, k, v))  # each [heads or kv_heads, d_model, d_head]
    kv_heads = k.shape[0]
    k, v = _repeat_kv(k, v, heads)
    o = _linear_output_heads(attention.dense.weight, heads)  # [heads, d_head, d_model]
    return (q, k, v, o), kv_heads


def _falcon_input_norm(layer: torch.nn.Module, config) -> torch.nn.Module:
    """FalconDecoderLayer.forward: ``ln_attn`` under the new decoder architecture with two norms, else
    ``input_layernorm``."""
    if config.new_decoder_architecture and config.num_ln_in_parallel_attn == 2:
        return layer.ln_attn
    return layer.input_layernorm


def _read_codegen(block: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    # CodeGenAttention.forward: qkv_proj [3 * d_model, d_model]; its output is viewed as (mp_num, 3 * local_dim),
    # local_dim = d_model / mp_num (the 4 model-parallel shards it was trained with), each shard split into query,
    # VALUE, key (that order); each of the three, the shards concatenated, is viewed as (heads, d_head);
    # out_proj [d_model, d_model]
    attention = block.attn
    heads = attention.num_attention_heads
    weight = attention.qkv_proj.weight  # [3 * d_model, d_model]
    d_model = weight.shape[1]
    shards = weight.reshape(getattr(attention, "mp_num", 4), 3, -1, d_model)  # [mp_num, (q, v, k), local, d_model]
    q, v, k = (_linear_heads(shards[:, part].reshape(-1, d_model), heads) for part in range(3))
    o = _linear_output_heads(attention.out_proj.weight, heads)  # [heads, d_head, d_model]
    return q, k, v, o


def _read_deberta(layer: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    # DisentangledSelfAttention: query_proj, key_proj, value_proj [heads * d_head, d_model], split per head by
    # transpose_for_scores (.view(..., heads, -1)); the content-to-content scores are query_layer @ key_layer^T.
    # Its c2p and p2c terms read relative position embeddings (through key_proj / query_proj, or pos_key_proj /
    # pos_query_proj): not in these matrices. DebertaV2SelfOutput.dense [d_model, heads * d_head]
    attention = layer.attention.self
    heads = attention.num_attention_heads
    q, k, v = (_linear_heads(getattr(attention, name).weight, heads)
               for name in ("query_proj", "key_proj", "value_proj"))
    o = _linear_output_heads(layer.attention.output.dense.weight, heads)  # [heads, d_head, d_model]
    return q, k, v, o


def _albert_layers(base: torch.nn.Module) -> tuple[list[torch.nn.Module], tuple[int, ...]]:
    """ALBERT's layers in the order AlbertTransformer.forward applies them, and the set of weights each applies:
    ``num_hidden_layers`` times, the group ``int(i / (layers / groups))``, each group its ``inner_group_num``
    AlbertLayers in turn (one group of one layer in every released ALBERT: one layer applied again and again)."""
    config, groups = base.config, base.encoder.albert_layer_groups
    layers, sets = [], []
    for index in range(config.num_hidden_layers):
        group = int(index / (config.num_hidden_layers / config.num_hidden_groups))
        for inner, layer in enumerate(groups[group].albert_layers):
            layers.append(layer)
            sets.append(group * len(groups[group].albert_layers) + inner)
    return layers, tuple(sets)


def _read_albert(layer: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    # AlbertAttention: query, key, value [heads * d_head, d_model] (d_model = hidden_size: the embeddings' own
    # embedding_size is mapped to it before the first layer), each viewed as (heads, d_head); dense [d_model,
    # d_model] reads the heads concatenated (before its LayerNorm)
    attention = layer.attention
    heads = attention.num_attention_heads
    q, k, v = (_linear_heads(getattr(attention, name).weight, heads) for name in ("query", "key", "value"))
    o = _linear_output_heads(attention.dense.weight, heads)  # [heads, d_head, d_model]
    return q, k, v, o


def _stack_of(base: torch.nn.Module, stack: str) -> torch.nn.Module:
    found = getattr(base, stack, None)
    if not isinstance(found, torch.nn.Module):
        raise ValueError(f"this {base.config.model_type} model has no {stack} (pass stack= "
                         f"{', '.join(repr(name) for name in STACKS if hasattr(base, name))})")
    return found


def _read_t5(block: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    # T5Block.layer[0] is its T5LayerSelfAttention (in the decoder, layer[1] is the cross-attention: not read).
    # T5Attention: q, k, v [heads * d_kv, d_model] (no bias), each viewed as (heads, d_kv); o [d_model, heads * d_kv].
    # Its scores are not scaled by 1/sqrt(d_kv), and its relative position bias is added to them: neither is a
    # weight of these matrices (the scores here do not change with a scale)
    attention = block.layer[0].SelfAttention
    heads = attention.n_heads
    q, k, v = (_linear_heads(getattr(attention, name).weight, heads) for name in ("q", "k", "v"))
    o = _linear_output_heads(attention.o.weight, heads)  # [heads, d_head, d_model]
    return q, k, v, o


def _read_bart(layer: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    # BartAttention (mBART's, Marian's, Pegasus's the same) as self_attn: q_proj, k_proj, v_proj [d_model, d_model],
    # each viewed as (heads, d_head); out_proj [d_model, d_model]. A decoder layer's encoder_attn is not read
    attention = layer.self_attn
    heads = attention.num_heads
    q, k, v = (_linear_heads(getattr(attention, name).weight, heads) for name in ("q_proj", "k_proj", "v_proj"))
    o = _linear_output_heads(attention.out_proj.weight, heads)  # [heads, d_head, d_model]
    return q, k, v, o


ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")
OUTPUT_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "out_lin")
# the separate query, key and value layers' names: most families', and DistilBERT's
SEPARATE_NAMES = (("q_proj", "k_proj", "v_proj"), ("q_lin", "k_lin", "v_lin"))
INPUT_NORM_NAMES = ("input_layernorm", "ln_1", "self_attn_layer_norm", "attention_norm", "ln_attn", "norm_1")
# one linear layer whose output is the queries, then the keys, then the values, each head-major (Phi-3's qkv_proj,
# MPT's Wqkv; GPT-BigCode's c_attn under multi-query attention; without it, c_attn is interleaved per head)
FUSED_NAMES = ("qkv_proj", "Wqkv", "c_attn")


def _linear_layers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, torch.nn.Module]] | None:
    """``(block, attention)`` of every layer of a model whose attention has separate ``q_proj``, ``k_proj`` and
    ``v_proj`` linear layers and one output projection (OPT, GPT-J, Gemma, Phi, StableLM, StarCoder2, ...): the one
    list of blocks that holds them; None when there is no such list."""
    for module in model.modules():
        if not isinstance(module, torch.nn.ModuleList) or not len(module):
            continue
        found = []
        for block in module:
            attention = next((getattr(block, name) for name in ATTENTION_NAMES
                              if isinstance(getattr(block, name, None), torch.nn.Module)), None)
            if attention is not None and not hasattr(attention, "q_proj"):  # GPT-Neo: attn.attention holds them
                attention = getattr(attention, "attention", attention)
            separate = attention is not None and _separate(attention) is not None
            fused = attention is not None and _fused(attention) is not None
            if not (separate or fused) or \
                    not any(isinstance(getattr(attention, name, None), torch.nn.Linear) for name in OUTPUT_NAMES):
                break
            found.append((block, attention))
        else:
            return found
    return None


def _separate(attention: torch.nn.Module) -> tuple[torch.nn.Linear, ...] | None:
    """The separate query, key and value layers of an attention (None: it has none)."""
    for names in SEPARATE_NAMES:
        layers = tuple(getattr(attention, name, None) for name in names)
        if all(isinstance(layer, torch.nn.Linear) for layer in layers):
            return layers
    return None


def _fused(attention: torch.nn.Module) -> torch.nn.Linear | None:
    """The fused q, k, v linear layer of an attention (None: none). Only GPT-BigCode's ``c_attn`` is read under that
    name (an attention with a ``multi_query`` flag): in blocks under multi-query attention, else interleaved per
    head (:func:`_interleaved`)."""
    for name in FUSED_NAMES:
        layer = getattr(attention, name, None)
        if isinstance(layer, torch.nn.Linear) and (name != "c_attn" or hasattr(attention, "multi_query")):
            return layer
    return None


def _interleaved(attention: torch.nn.Module) -> bool:
    """Whether the fused projection holds each head's query, key and value together (GPT-BigCode without multi-query
    attention: GPTBigCodeAttention.forward views c_attn's output as (heads, 3 * head_dim) and splits each head's
    into q, k, v, as GPT-NeoX does)."""
    return isinstance(getattr(attention, "c_attn", None), torch.nn.Linear) and \
        not getattr(attention, "multi_query", True)


def _read_linear(model: torch.nn.Module) -> tuple[list, list, int, bool]:
    """The generic reader: each layer's ``(q, k, v, o)`` (K/V heads repeated for the query heads that share them),
    the norm that feeds each attention (None where none is found), the K/V heads, and whether the model is pre-norm.
    Refused for queries and keys normalised per head (``q_norm``/``k_norm``: QK is then no product of weights)."""
    config = model.config
    layers = _linear_layers(model)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    read, norms = [], []
    for block, attention in layers:
        if any(isinstance(getattr(attention, name, None), torch.nn.Module) for name in ("q_norm", "k_norm")) or \
                getattr(getattr(config, "attn_config", None), "qk_ln", False):  # MPT's qk_ln: the same
            raise ValueError(f"{config.model_type}'s attention normalises each head's queries and keys (q_norm, "
                             "k_norm): the query-key form is not a product of weight matrices, so composition scores "
                             "from the weights would be wrong")
        output = next(getattr(attention, name) for name in OUTPUT_NAMES
                      if isinstance(getattr(attention, name, None), torch.nn.Linear))
        separate = _separate(attention)
        fused = None if separate is not None else _fused(attention)
        if fused is None:
            q_weight, k_weight, v_weight = (layer.weight for layer in separate)
        elif _interleaved(attention):  # [heads * 3 * d_head, d_model]: each head's q, k, v in turn
            per_head = fused.weight.reshape(heads, 3, -1, fused.in_features)  # [heads, (q, k, v), d_head, d_model]
            q_weight, k_weight, v_weight = (per_head[:, part].reshape(-1, fused.in_features) for part in range(3))
            kv_heads = heads
        else:  # [q_dim + 2 * kv_dim, d_model], the queries, keys and values in blocks
            q_dim = output.in_features
            kv_dim = (fused.out_features - q_dim) // 2
            q_weight, k_weight, v_weight = fused.weight.split((q_dim, kv_dim, kv_dim), dim=0)
            kv_heads = heads * kv_dim // q_dim
        q = _linear_heads(q_weight, heads)  # [heads, d_model, d_head]
        k = _linear_heads(k_weight, kv_heads)  # [kv_heads, d_model, d_head]
        v = _linear_heads(v_weight, kv_heads)
        k, v = k.repeat_interleave(heads // kv_heads, dim=0), v.repeat_interleave(heads // kv_heads, dim=0)
        read.append((q, k, v, _linear_output_heads(output.weight, heads)))  # o: [heads, d_head, d_model]
        norms.append(next((getattr(block, name) for name in INPUT_NORM_NAMES
                           if isinstance(getattr(block, name, None), torch.nn.Module)), None))
    # OPT-350m puts its norms after; so does a model whose blocks have no norm before their attention (DistilBERT)
    pre_norm = bool(getattr(config, "do_layer_norm_before", True)) and any(norm is not None for norm in norms)
    return read, norms, kv_heads, pre_norm


def _norm_gain(norm: torch.nn.Module) -> tuple[torch.Tensor | None, bool]:
    """``(gain [d_model] or None for none, centres)`` of a LayerNorm or an RMSNorm that scales by its weight (T5's
    T5LayerNorm is one: no centring, no bias)."""
    if isinstance(norm, torch.nn.LayerNorm):
        return norm.weight, True
    rms = type(norm).__name__.endswith("RMSNorm") or type(norm).__name__ == "T5LayerNorm"
    if rms and isinstance(getattr(norm, "weight", None), torch.Tensor):
        width = norm.weight.shape[0]
        try:  # read by calling it: Gemma's scales by 1 + weight
            found = frozen_norm(norm, width)
        except NotReadable:
            return norm.weight, False
        return found.gain.to(norm.weight.dtype), found.centres
    raise ValueError(f"cannot fold the norm {type(norm).__name__} into the heads' weights: pass fold_norm=False")


def _positions(config, family: str) -> tuple[str, float]:
    """``(kind of positions, share of each head's dimensions RoPE rotates)`` from the config."""
    if family == "t5":  # a learned bias per head and bucket of relative distance, added to the scores
        return "relative bias", 0.0
    if family == "deberta":  # c2p / p2c terms added to the scores (a DeBERTa without them: its absolute table only)
        relative = getattr(config, "relative_attention", False) and getattr(config, "pos_att_type", None)
        return ("disentangled relative" if relative else "learned absolute"), 0.0
    if family == "bart":
        return ("sinusoidal absolute" if config.model_type in ("marian", "pegasus") else "learned absolute"), 0.0
    if family == "codegen":  # its first rotary_dim dimensions of each head (all of them without rotary_dim)
        d_head = config.n_embd // config.n_head
        return "rotary", min(config.rotary_dim or d_head, d_head) / d_head
    if getattr(config, "alibi", False) or getattr(config, "position_embedding_type", None) == "alibi" or \
            getattr(config, "model_type", None) == "bloom" or \
            getattr(getattr(config, "attn_config", None), "alibi", False):  # BLOOM always adds ALiBi; MPT by default
        return "alibi", 0.0
    rope = getattr(config, "rope_parameters", None)
    if getattr(config, "rotary_dim", None) and getattr(config, "n_embd", None) and getattr(config, "n_head", None):
        return "rotary", float(config.rotary_dim) / (config.n_embd // config.n_head)  # GPT-J: the first dims only
    if family in ("llama", "gpt_neox") or rope is not None or hasattr(config, "rotary_pct"):
        fraction = (rope or {}).get("partial_rotary_factor", getattr(config, "rotary_pct", 1.0))
        return "rotary", float(fraction)
    return "learned absolute", 0.0


def head_weights(model: torch.nn.Module, fold_norm: bool | None = None,
                 dtype: torch.dtype = torch.float32, stack: str | None = None) -> HeadWeights:
    """Every self-attention head's W_Q, W_K, W_V ``[d_model, d_head]`` and W_O ``[d_head, d_model]``.

    ``fold_norm`` (default: yes for pre-norm models, GPT-2, Llama-family, GPT-NeoX, Falcon, CodeGen, T5, mBART,
    Pegasus; no for post-norm BERT, DeBERTa, ALBERT, BART, Marian): fold the gain of the norm that feeds each
    attention into W_Q, W_K and W_V (``diag(gamma) @ W``), and for a LayerNorm, which subtracts each token's mean,
    also centre them (subtract the mean over d_model), as TransformerLens's ``fold_layer_norm`` does with
    ``center_weights=True`` (RMSNorm, T5's T5LayerNorm: gain only). A head only ever reads the normed residual
    stream, so its weights with the gain folded in are what it applies to the stream itself (up to the per-token
    scale the norm divides by); without it, a large gain on a few dimensions is invisible to the scores. W_O is
    never changed. For a post-norm model ``fold_norm=True`` folds the LayerNorm that produced each layer's input
    (the embeddings' for layer 0, else the previous layer's output norm; DeBERTa's convolution's after its first
    layer where it has one); refused where a layer's input comes from no norm (ALBERT's first layer reads the
    embeddings through a linear map, Marian's its embeddings unnormalised).

    ``stack``: an encoder-decoder's (T5, BART, mBART, Marian, Pegasus) "encoder" (the default) or "decoder"
    self-attention heads, each stack its own residual stream; cross-attention is never read (its keys and values
    come from the other stream: no composition between heads of one stream). A model of one stack takes none.

    ALBERT's layers share their weights: each of its ``num_hidden_layers`` layers (times ``inner_group_num``) is
    read with the weights it applies, the same matrices again (``shared_weights`` says which set each applies).

    Biases are ignored (they are not part of the bilinear forms the scores compare)."""
    family = family_of(model)
    config = model.config
    base = getattr(model, "base_model", model)
    if family in ENCODER_DECODER_FAMILIES:
        stack = stack or ("encoder" if isinstance(getattr(base, "encoder", None), torch.nn.Module) else "decoder")
        if stack not in STACKS:
            raise ValueError(f"stack is 'encoder' or 'decoder' (each stack's self-attention heads), not {stack!r}: "
                             "cross-attention is not read, its keys and values coming from the other stream")
    elif stack is not None:
        raise ValueError(f"stack= is for encoder-decoders; this {config.model_type} model has one stack of layers")
    post_norm = family in ("bert", "deberta", "albert") or (family == "bart" and not BART_LIKE[config.model_type])
    pre_norm = not post_norm  # the generic reader finds out for itself
    read, norms, shared, no_norm = [], [], (), "the norm that feeds each attention was not found"
    kv_heads = None
    if family == "linear":
        read, norms, kv_heads, pre_norm = _read_linear(model)
    elif family == "gpt2":
        blocks = list(base.h)
        read = [_read_gpt2(block) for block in blocks]
        norms = [block.ln_1 for block in blocks]
    elif family == "llama":
        heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None)
        kv_heads = kv_heads or heads
        read = [_read_llama(layer, heads, kv_heads) for layer in base.layers]
        norms = [layer.input_layernorm for layer in base.layers]
    elif family == "gpt_neox":
        heads = getattr(config, "num_attention_heads", None) or config.n_head
        blocks = list(base.layers) if hasattr(base, "layers") else list(base.h)  # BLOOM: h
        read = [_read_gpt_neox(layer, heads) for layer in blocks]
        norms = [layer.input_layernorm for layer in blocks]
    elif family == "falcon":
        found = [_read_falcon(layer) for layer in base.h]
        read, kv_heads = [parts for parts, _ in found], found[0][1]
        norms = [_falcon_input_norm(layer, config) for layer in base.h]
    elif family == "codegen":
        read = [_read_codegen(block) for block in base.h]
        norms = [block.ln_1 for block in base.h]
    elif family == "deberta":
        layers = list(base.encoder.layer)
        read = [_read_deberta(layer) for layer in layers]
        norms = [base.embeddings.LayerNorm] + [layer.output.LayerNorm for layer in layers[:-1]]
        if getattr(base.encoder, "conv", None) is not None and len(layers) > 1:  # its ConvLayer's norm after layer 0
            norms[1] = base.encoder.conv.LayerNorm
    elif family == "albert":
        layers, shared = _albert_layers(base)
        read = [_read_albert(layer) for layer in layers]
        norms = [None] + [layer.full_layer_layer_norm for layer in layers[:-1]]
        no_norm = ("ALBERT's first layer reads the embeddings through a linear map (embedding_hidden_mapping_in), not "
                   "from a norm")
    elif family == "t5":
        blocks = list(_stack_of(base, stack).block)
        read = [_read_t5(block) for block in blocks]
        norms = [block.layer[0].layer_norm for block in blocks]
    elif family == "bart":
        part = _stack_of(base, stack)
        layers = list(part.layers)
        read = [_read_bart(layer) for layer in layers]
        if pre_norm:  # mBART, Pegasus: self_attn_layer_norm before self_attn
            norms = [layer.self_attn_layer_norm for layer in layers]
        else:  # BART, Marian: the embeddings' LayerNorm (Marian: none), then each layer's final_layer_norm
            norms = [getattr(part, "layernorm_embedding", None)] + [layer.final_layer_norm for layer in layers[:-1]]
            no_norm = f"{config.model_type}'s first layer reads its embeddings without a norm"
    else:
        layers = list(base.encoder.layer)
        read = [_read_bert(layer) for layer in layers]
        norms = [base.embeddings.LayerNorm] + [layer.output.LayerNorm for layer in layers[:-1]]
    fold = pre_norm if fold_norm is None else bool(fold_norm)
    if fold and any(norm is None for norm in norms):
        raise ValueError(f"{no_norm}: pass fold_norm=False")
    if len({tuple(part.shape) for parts in read for part in parts[:1]}) > 1:
        raise ValueError("composition scores need the same number of heads in every layer; this model's differ "
                         "(pruned heads?)")
    if not all(part.is_floating_point() for parts in read for part in parts):
        raise ValueError("composition scores read floating-point weights; this model's attention weights are "
                         "quantized (packed integers): load it unquantized")
    q, k, v, o = (torch.stack([parts[index] for parts in read]).detach().to(dtype) for index in range(4))
    # q, k, v: [layers, heads, d_model, d_head]; o: [layers, heads, d_head, d_model]
    kv_heads = kv_heads or q.shape[1]
    present = [norm for norm in norms if norm is not None]
    norm_name = "none" if not present else "LayerNorm" if isinstance(present[0], torch.nn.LayerNorm) else "RMSNorm"
    if fold:
        gains, centres = zip(*(_norm_gain(norm) for norm in norms), strict=True)
        d_model = q.shape[2]
        gain = torch.stack([torch.ones(d_model) if g is None else g.detach().float().cpu() for g in gains])
        gain = gain.to(device=q.device, dtype=dtype)[:, None, :, None]  # [layers, 1, d_model, 1]
        q, k, v = q * gain, k * gain, v * gain  # diag(gamma) @ W
        if all(centres):
            q, k, v = (w - w.mean(dim=2, keepdim=True) for w in (q, k, v))  # P @ W, P = I - 11^T / d_model
    positions, rotary = _positions(config, family)
    return HeadWeights(W_Q=q, W_K=k, W_V=v, W_O=o, model_type=config.model_type, family=family, kv_heads=kv_heads,
                       pre_norm=pre_norm, norm=norm_name, folded=fold, positions=positions, rotary_fraction=rotary,
                       stack=stack or "", shared_weights=shared)
