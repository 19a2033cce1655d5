"""Every self-attention head's weight matrices, read as transformers' own attention code splits them: W_Q, W_K, W_V
``[d_model, d_head]`` and W_O ``[d_head, d_model]`` per layer and query head (a grouped-query head gets the K/V head it
shares), in the row-vector convention, with the norm's gain that feeds each attention folded in where asked, and the
facts that decide what products of them mean (positions, grouped K/V heads). What
:mod:`attnviz.interventions.composition` scores.

One reader per layout: GPT-2's fused ``c_attn``; the Llama family's ``q_proj``/``k_proj``/``v_proj``/``o_proj``;
BERT's ``query``/``key``/``value``; GPT-NeoX's and BLOOM's per-head interleaved ``query_key_value``; and a generic
reader for any other model whose attention has separate q/k/v layers or one q|k|v projection in blocks. Biases are
ignored. Checked for each family against transformers 5.25, and in the tests against the projections applied to an
identity matrix.

Imports torch and attnviz.interventions.anatomy (a norm's gain, read by calling it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.interventions.anatomy import NotReadable, frozen_norm

# model_type -> the reader that knows its layout (checked against transformers 5.25's modeling code)
LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe")
BERT_LIKE = ("bert", "roberta", "xlm-roberta", "electra")
FAMILIES = {"gpt2": "gpt2", "gpt_neox": "gpt_neox", "bloom": "gpt_neox", **{name: "llama" for name in LLAMA_LIKE},
            **{name: "bert" for name in BERT_LIKE}}


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
    family: str  # the reader used: "gpt2", "llama", "bert" or "gpt_neox"
    kv_heads: int  # K/V heads per layer (= heads without grouped-query attention)
    pre_norm: bool  # a norm sits between the residual stream and each attention's input
    norm: str  # the norm that feeds each attention: "LayerNorm" or "RMSNorm"
    folded: bool  # the norm's gain (and, for LayerNorm, its centring) is folded into W_Q, W_K, W_V
    positions: str  # "learned absolute", "rotary" or "alibi"
    rotary_fraction: float  # the share of each head's query/key dimensions that RoPE rotates (0 without RoPE)

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
    """The reader for ``model`` ("gpt2", "llama", "bert", "gpt_neox", or "linear": any other model whose attention
    has separate q_proj, k_proj and v_proj layers), or a ValueError that names what is read."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type in FAMILIES:
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError(f"composition scores read decoder-only or encoder-only models; this {model_type} model "
                             "is an encoder-decoder")
        return FAMILIES[model_type]
    if model_type and _linear_layers(model) is not None:
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError(f"composition scores read decoder-only or encoder-only models; this {model_type} model "
                             "is an encoder-decoder")
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


ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")
OUTPUT_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "out_lin")
# the separate query, key and value layers' names: most families', and DistilBERT's
SEPARATE_NAMES = (("q_proj", "k_proj", "v_proj"), ("q_lin", "k_lin", "v_lin"))
INPUT_NORM_NAMES = ("input_layernorm", "ln_1", "self_attn_layer_norm", "attention_norm", "ln_attn", "norm_1")
# one linear layer whose output is the queries, then the keys, then the values, each head-major (Phi-3's qkv_proj,
# MPT's Wqkv; GPT-BigCode's c_attn under multi-query attention)
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
    """The fused q|k|v linear layer of an attention laid out in blocks (None: none). GPT-BigCode's c_attn is in
    blocks only under multi-query attention (else interleaved per head, not read)."""
    for name in FUSED_NAMES:
        layer = getattr(attention, name, None)
        if isinstance(layer, torch.nn.Linear) and (name != "c_attn" or getattr(attention, "multi_query", False)):
            return layer
    return None


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
    """``(gain [d_model] or None for none, centres)`` of a LayerNorm or an RMSNorm that scales by its weight."""
    if isinstance(norm, torch.nn.LayerNorm):
        return norm.weight, True
    if type(norm).__name__.endswith("RMSNorm") and isinstance(getattr(norm, "weight", None), torch.Tensor):
        width = norm.weight.shape[0]
        try:  # read by calling it: Gemma's scales by 1 + weight
            found = frozen_norm(norm, width)
        except NotReadable:
            return norm.weight, False
        return found.gain.to(norm.weight.dtype), found.centres
    raise ValueError(f"cannot fold the norm {type(norm).__name__} into the heads' weights: pass fold_norm=False")


def _positions(config, family: str) -> tuple[str, float]:
    """``(kind of positions, share of each head's dimensions RoPE rotates)`` from the config."""
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
                 dtype: torch.dtype = torch.float32) -> HeadWeights:
    """Every self-attention head's W_Q, W_K, W_V ``[d_model, d_head]`` and W_O ``[d_head, d_model]``.

    ``fold_norm`` (default: yes for pre-norm models, GPT-2, Llama-family, GPT-NeoX; no for post-norm BERT): fold
    the gain of the norm that feeds each attention into W_Q, W_K and W_V (``diag(gamma) @ W``), and for a LayerNorm,
    which subtracts each token's mean, also centre them (subtract the mean over d_model), as TransformerLens's
    ``fold_layer_norm`` does with ``center_weights=True`` (RMSNorm: gain only). A head only ever reads the normed
    residual stream, so its weights with the gain folded in are what it applies to the stream itself (up to the
    per-token scale the norm divides by); without it, a large gain on a few dimensions is invisible to the scores.
    W_O is never changed. For BERT (post-norm) ``fold_norm=True`` folds the LayerNorm that produced each layer's
    input (the embeddings' for layer 0, else the previous layer's output norm).

    Biases are ignored (they are not part of the bilinear forms the scores compare)."""
    family = family_of(model)
    config = model.config
    base = getattr(model, "base_model", model)
    pre_norm = family != "bert"
    read, norms = [], []
    if family == "linear":
        read, norms, kv_heads, pre_norm = _read_linear(model)
    fold = pre_norm if fold_norm is None else bool(fold_norm)
    if fold and any(norm is None for norm in norms):
        raise ValueError("the norm that feeds each attention was not found: pass fold_norm=False")
    if family == "linear":
        pass
    elif family == "gpt2":
        blocks = list(base.h)
        read = [_read_gpt2(block) for block in blocks]
        norms = [block.ln_1 for block in blocks]
        kv_heads = config.n_head
    elif family == "llama":
        heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None)
        kv_heads = kv_heads or heads
        read = [_read_llama(layer, heads, kv_heads) for layer in base.layers]
        norms = [layer.input_layernorm for layer in base.layers]
    elif family == "gpt_neox":
        heads = kv_heads = getattr(config, "num_attention_heads", None) or config.n_head
        blocks = list(base.layers) if hasattr(base, "layers") else list(base.h)  # BLOOM: h
        read = [_read_gpt_neox(layer, heads) for layer in blocks]
        norms = [layer.input_layernorm for layer in blocks]
    else:
        layers = list(base.encoder.layer)
        read = [_read_bert(layer) for layer in layers]
        norms = [base.embeddings.LayerNorm] + [layer.output.LayerNorm for layer in layers[:-1]]
        kv_heads = read[0][0].shape[0]
    if len({tuple(part.shape) for parts in read for part in parts[:1]}) > 1:
        raise ValueError("composition scores need the same number of heads in every layer; this model's differ "
                         "(pruned heads?)")
    if not all(part.is_floating_point() for parts in read for part in parts):
        raise ValueError("composition scores read floating-point weights; this model's attention weights are "
                         "quantized (packed integers): load it unquantized")
    q, k, v, o = (torch.stack([parts[index] for parts in read]).detach().to(dtype) for index in range(4))
    # q, k, v: [layers, heads, d_model, d_head]; o: [layers, heads, d_head, d_model]
    norm_name = "LayerNorm" if isinstance(norms[0], torch.nn.LayerNorm) else "RMSNorm"
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
                       pre_norm=pre_norm, norm=norm_name, folded=fold, positions=positions, rotary_fraction=rotary)
