"""Every self-attention head's weight matrices, read as transformers' own attention code splits them: W_Q, W_K, W_V
``[d_model, d_head]`` and W_O ``[d_head, d_model]`` per layer and query head (a grouped-query head gets the K/V head it
shares), in the row-vector convention, with the norm's gain that feeds each attention folded in where asked, and the
facts that decide what products of them mean (positions, grouped K/V heads, shared layers, which stack). What
:mod:`attnviz.interventions.composition` scores.

The families read: GPT-2, the Llama family (Llama, Mistral, Mixtral, Qwen2), BERT (RoBERTa, XLM-RoBERTa, ELECTRA),
GPT-NeoX and BLOOM, Falcon, CodeGen, DeBERTa-v2, ALBERT (its shared layer read once per layer it serves), the
encoder's self-attention stack of T5 and of BART, mBART, Marian and Pegasus, or, asked with ``stack="decoder"``, the
decoder's (cross-attention never: it is no composition between heads of one residual stream), and any other model
whose attention has separate q/k/v layers or one projection holding q, k and v. Each family's layout is read by
:mod:`attnviz.interventions.head_weight_layouts`. Biases are ignored.

Imports torch, attnviz.interventions.head_weight_layouts (the per-family readers) and
attnviz.interventions.anatomy (a norm's gain, read by calling it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.interventions.anatomy import NotReadable, frozen_norm
from attnviz.interventions.head_weight_layouts import (  # noqa: F401 - the *_NAMES: importable from here as before
    ATTENTION_NAMES,
    FUSED_NAMES,
    INPUT_NORM_NAMES,
    OUTPUT_NAMES,
    SEPARATE_NAMES,
    _albert_layers,
    _falcon_input_norm,
    _linear_layers,
    _read_albert,
    _read_bart,
    _read_bert,
    _read_codegen,
    _read_deberta,
    _read_falcon,
    _read_gpt2,
    _read_gpt_neox,
    _read_linear,
    _read_llama,
    _read_t5,
    has_per_head_norms,
)

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
    # queries and keys normalised per head (q_norm, k_norm): their gains folded into W_Q and W_K, their per-token
    # scale (a positive factor on each query-key score) left out
    per_head_norms: bool = False

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


def _stack_of(base: torch.nn.Module, stack: str) -> torch.nn.Module:
    found = getattr(base, stack, None)
    if not isinstance(found, torch.nn.Module):
        raise ValueError(f"this {base.config.model_type} model has no {stack} (pass stack= "
                         f"{', '.join(repr(name) for name in STACKS if hasattr(base, name))})")
    return found


def _norm_gain(norm: torch.nn.Module) -> tuple[torch.Tensor | None, bool]:
    """``(gain [d_model] or None for none, centres)`` of a LayerNorm or an RMSNorm that scales by its weight (T5's
    T5LayerNorm is one: no centring, no bias)."""
    if isinstance(norm, torch.nn.LayerNorm):
        return norm.weight, True
    shape = getattr(norm, "normalized_shape", None)
    if not list(norm.parameters()) and isinstance(shape, tuple) and len(shape) == 1:  # OLMo: no weight, no bias
        probe = torch.randn(2, shape[0], generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            if torch.allclose(norm(probe), torch.nn.functional.layer_norm(probe, shape, eps=1e-5), atol=1e-5):
                return torch.ones(shape[0]), True  # a LayerNorm with gain 1
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
    if family == "t5" or getattr(config, "model_type", None) == "mpnet":  # a learned bias per head and bucket of
        # relative distance, added to the scores (MPNet's shared by every layer)
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
                       stack=stack or "", shared_weights=shared,
                       per_head_norms=family == "linear" and any(has_per_head_norms(attention)
                                                                 for _, attention in _linear_layers(model)))
