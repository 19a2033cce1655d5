"""Each model family's layout of its attention weights, read into every head's W_Q, W_K, W_V ``[heads, d_model,
d_head]`` and W_O ``[heads, d_head, d_model]`` for one layer (a grouped-query head gets the K/V head it shares), in
the row-vector convention: the readers behind :func:`attnviz.interventions.head_weights.head_weights`.

One reader per layout: GPT-2's fused ``c_attn``; the Llama family's ``q_proj``/``k_proj``/``v_proj``/``o_proj``;
BERT's ``query``/``key``/``value``; GPT-NeoX's and BLOOM's per-head interleaved ``query_key_value``; Falcon's
``query_key_value`` in its three layouts (grouped K/V heads under ``new_decoder_architecture``, multi-query, per-head
interleaved); CodeGen's ``qkv_proj`` interleaved across its four model-parallel shards (in the order q, v, k);
DeBERTa-v2's ``query_proj``/``key_proj``/``value_proj`` (the content-to-content weights: its relative-position
terms are not weights of this form, and are left out); ALBERT's one shared layer (or groups of layers), read once
per layer it serves; the self-attention of a T5 block (``SelfAttention.q/k/v/o``) and of a BART, mBART, Marian or
Pegasus layer (``self_attn``; cross-attention never); and a generic reader for any other model whose attention has
separate q/k/v layers or one projection holding q, k and v (in blocks; GPT-BigCode's ``c_attn`` without multi-query
attention interleaved per head), which also finds each layer's input norm. Biases are ignored. Checked for each
family against transformers 5.25, and in the tests against the model's own attention code run on an identity matrix.

Imports torch and attnviz.interventions.anatomy (a per-head norm's gain, read by calling it).
"""

from __future__ import annotations

import torch

from attnviz.interventions.anatomy import NotReadable, frozen_norm


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
OUTPUT_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "out_lin", "o")
# the separate query, key and value layers' names: most families', and DistilBERT's
SEPARATE_NAMES = (("q_proj", "k_proj", "v_proj"), ("q_lin", "k_lin", "v_lin"), ("q", "k", "v"))  # MPNet: q, k, v
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
            if attention is not None and _separate(attention) is None and \
                    isinstance(getattr(attention, "attn", None), torch.nn.Module):  # MPNet: attention.attn
                attention = attention.attn
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


def has_per_head_norms(attention: torch.nn.Module) -> bool:
    """Whether an attention normalises each head's queries and keys (``q_norm``, ``k_norm``)."""
    return any(isinstance(getattr(attention, name, None), torch.nn.Module) for name in ("q_norm", "k_norm"))


def _per_head_norm_gain(norm: torch.nn.Module | None, part: torch.Tensor, config) -> torch.Tensor:
    """``part`` ``[heads, d_model, d_head]`` times the gain of the norm applied to each head's queries or keys
    (Qwen3's RMSNorm: its weight; Gemma 3's: 1 + weight; read by calling it); ``part`` itself without one."""
    if norm is None:
        return part
    width = part.shape[-1]
    try:
        found = frozen_norm(norm, width)
    except NotReadable as problem:
        raise ValueError(f"{config.model_type}'s per-head norm of queries or keys was not read: {problem}") from None
    if found.centres or bool(found.bias.abs().max() > 0):
        raise ValueError(f"{config.model_type}'s per-head norm of queries or keys centres or shifts them: the "
                         "query-key form is not a product of weight matrices")
    return part * found.gain.to(part.dtype)  # [heads, d_model, d_head] * [d_head]


def _read_linear(model: torch.nn.Module) -> tuple[list, list, int, bool]:
    """The generic reader: each layer's ``(q, k, v, o)`` (K/V heads repeated for the query heads that share them),
    the norm that feeds each attention (None where none is found), the K/V heads, and whether the model is pre-norm.
    Queries and keys normalised per head (``q_norm``/``k_norm``: Qwen3, Gemma 3, OLMo 2 when per head) have their
    norms' gains folded into W_Q and W_K (their per-token scale is a positive factor on each score, left out);
    MPT's ``qk_ln`` (one LayerNorm over every head's queries together, centring them) is refused."""
    config = model.config
    layers = _linear_layers(model)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    read, norms = [], []
    for block, attention in layers:
        if getattr(getattr(config, "attn_config", None), "qk_ln", False):  # MPT: one norm over all heads together
            raise ValueError(f"{config.model_type}'s attention normalises the queries and keys of all its heads "
                             "together (qk_ln, centring them): the query-key form is not a product of weight matrices, "
                             "so composition scores from the weights would be wrong")
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
        q, k = (_per_head_norm_gain(getattr(attention, name, None), part, config)
                for name, part in (("q_norm", q), ("k_norm", k)))
        read.append((q, k, v, _linear_output_heads(output.weight, heads)))  # o: [heads, d_head, d_model]
        norms.append(next((getattr(block, name) for name in INPUT_NORM_NAMES
                           if isinstance(getattr(block, name, None), torch.nn.Module)), None))
    # OPT-350m puts its norms after; so does a model whose blocks have no norm before their attention (DistilBERT)
    pre_norm = bool(getattr(config, "do_layer_norm_before", True)) and any(norm is not None for norm in norms)
    return read, norms, kv_heads, pre_norm
