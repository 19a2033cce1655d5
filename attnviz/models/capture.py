"""Run a model on a text and capture, for every attention call, the queries, keys, mask, scale and weights.

Capture works by wrapping the module-level ``eager_attention_forward`` that transformers' attention modules call
(BERT, RoBERTa, DistilBERT, GPT-2, Llama, BART, T5, ...). The wrapper records exactly what the model's own
attention received and returned, so :func:`replay` can recompute every head with ``attnviz.attention`` and
prove the two agree.
"""

from __future__ import annotations

import inspect
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from attnviz import masks
from attnviz.attention import repeat_kv, scaled_dot_product_attention
from attnviz.models.loading import FallbackTokenizer, ModelBundle

_CAPTURE_LOCK = threading.RLock()  # module globals (and, for experiments, weights) are patched: one run at a time


@dataclass
class AttentionRecord:
    """One attention kind ("self", "encoder", "decoder" or "cross") over all its layers, batch of one."""

    kind: str
    weights: torch.Tensor  # [layers, heads, n_q, n_k], the model's own softmax output
    queries: torch.Tensor  # [layers, heads, n_q, d_head], as the attention saw them (after RoPE, if any)
    keys: torch.Tensor  # [layers, kv_heads, n_k, d_head]
    allowed: torch.Tensor  # [layers, n_q, n_k] bool, True = may attend (from the model's own mask)
    bias: torch.Tensor | None  # [layers, heads, n_q, n_k] additive position bias (T5), else None
    scales: list[float]  # per layer
    query_tokens: list[str]
    key_tokens: list[str]

    @property
    def n_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def n_heads(self) -> int:
        return self.weights.shape[1]

    @property
    def n_kv_heads(self) -> int:
        return self.keys.shape[1]


@dataclass
class Capture:
    model_name: str
    text: str
    text_pair: str | None
    tokens: list[str]  # the (encoder) input tokens
    segments: list[int]  # 0 = sentence A, 1 = sentence B, per token
    special: list[bool]  # [CLS], [SEP], <s>, padding, ...
    records: dict[str, AttentionRecord] = field(default_factory=dict)
    truncated: bool = False
    n_tokens_before_truncation: int = 0
    decoder_tokens: list[str] | None = None

    @property
    def kinds(self) -> list[str]:
        return list(self.records)


def _attention_kind(module_name: str, encoder_decoder: bool) -> str:
    if not encoder_decoder:
        return "self"
    lowered = module_name.lower()
    if "encoder_attn" in lowered or "encdecattention" in lowered or "crossattention" in lowered:
        return "cross"
    return "encoder" if lowered.startswith("encoder") or ".encoder." in lowered else "decoder"


@contextmanager
def _observe_eager_attention(model: torch.nn.Module, calls: list):
    """Wrap every ``eager_attention_forward`` the model's modules use; append one record per call to ``calls``."""
    names = {id(module): name for name, module in model.named_modules()}
    sources = {
        sys.modules[type(m).__module__]
        for m in model.modules()
        if hasattr(sys.modules.get(type(m).__module__), "eager_attention_forward")
    }
    originals = {source: source.eager_attention_forward for source in sources}

    def make_wrapper(original):
        signature = inspect.signature(original)

        def observed(module, *args, **kwargs):
            output, weights = original(module, *args, **kwargs)
            bound = signature.bind(module, *args, **kwargs)
            arguments = bound.arguments
            extra = arguments.get("kwargs", {})
            calls.append(
                {
                    "name": names.get(id(module), ""),
                    "query": arguments["query"].detach(),
                    "key": arguments["key"].detach(),
                    "mask": arguments.get("attention_mask"),
                    "scaling": arguments.get("scaling", None),
                    "position_bias": arguments.get("position_bias", extra.get("position_bias")),
                    "weights": weights.detach(),
                }
            )
            return output, weights

        return observed

    try:
        for source, original in originals.items():
            source.eager_attention_forward = make_wrapper(original)
        yield
    finally:
        for source, original in originals.items():
            source.eager_attention_forward = original


def _allowed_from_model_mask(mask, n_q: int, n_k: int) -> torch.Tensor:
    """The model's mask (additive float, boolean or None) -> ``[n_q, n_k]`` bool, True = may attend."""
    if mask is None:
        return torch.ones(n_q, n_k, dtype=torch.bool)
    mask = mask[..., :n_k]
    allowed = mask if mask.dtype == torch.bool else masks.from_additive(mask)
    return allowed.reshape(-1, *allowed.shape[-2:])[0].expand(n_q, n_k).clone()  # batch of one, same for all heads


def _tokenize(bundle: ModelBundle, text: str, text_pair: str | None, max_tokens: int, fallback: str | None = None):
    tokenizer = bundle.tokenizer
    if isinstance(tokenizer, FallbackTokenizer):
        if fallback:
            tokenizer = FallbackTokenizer(fallback, tokenizer.vocab_size)
        tokens = tokenizer.tokenize(text) + (tokenizer.tokenize(text_pair) if text_pair else [])
        ids = tokenizer.ids(tokenizer.tokenize(text), text) + (
            tokenizer.ids(tokenizer.tokenize(text_pair), text_pair) if text_pair else []
        )
        segments = [0] * len(tokenizer.tokenize(text)) + [1] * (len(tokens) - len(tokenizer.tokenize(text)))
        total = len(ids)
        ids, tokens, segments = ids[:max_tokens], tokens[:max_tokens], segments[:max_tokens]
        inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        return inputs, tokens, segments, [False] * len(tokens), total
    full = tokenizer(text, text_pair, truncation=False, add_special_tokens=True)
    total = len(full["input_ids"])
    encoded = tokenizer(
        text, text_pair, truncation=True, max_length=max_tokens, return_tensors="pt", return_token_type_ids=None
    )
    ids = encoded["input_ids"][0].tolist()
    tokens = tokenizer.convert_ids_to_tokens(ids)
    special_ids = set(tokenizer.all_special_ids)
    special = [i in special_ids for i in ids]
    if "token_type_ids" in encoded and text_pair:
        segments = encoded["token_type_ids"][0].tolist()
    elif text_pair:
        sequence_ids = encoded.sequence_ids(0) if hasattr(encoded, "sequence_ids") else None
        segments = [1 if s == 1 else 0 for s in sequence_ids] if sequence_ids else [0] * len(ids)
        # A special token after the first sentence's end belongs to B for the A/B filters.
        if sequence_ids:
            seen_b = False
            for i, s in enumerate(sequence_ids):
                seen_b = seen_b or s == 1
                segments[i] = 1 if (s == 1 or (s is None and seen_b)) else 0
    else:
        segments = [0] * len(ids)
    accepted = set(inspect.signature(bundle.model.forward).parameters)
    inputs = {k: v for k, v in encoded.items() if k in accepted}
    return inputs, tokens, segments, special, total


def _model_inputs(bundle: ModelBundle, text: str, text_pair: str | None, limit: int, fallback: str | None):
    """Tokenize for the model: ``(inputs, tokens, segments, special, total, decoder_tokens)``. For an
    encoder-decoder model the pair is the decoder's input (default: the text itself)."""
    encoder_decoder = bundle.architecture == "encoder-decoder"
    inputs, tokens, segments, special, total = _tokenize(
        bundle, text, None if encoder_decoder else text_pair, limit, fallback
    )
    decoder_tokens = None
    if encoder_decoder:
        decoder_inputs, decoder_tokens, _, _, _ = _tokenize(bundle, text_pair or text, None, limit, fallback)
        inputs["decoder_input_ids"] = decoder_inputs["input_ids"]
        if "attention_mask" in decoder_inputs:
            inputs["decoder_attention_mask"] = decoder_inputs["attention_mask"]
    return inputs, tokens, segments, special, total, decoder_tokens


def _record_of(kind: str, kind_calls: list[dict], query_tokens: list[str], key_tokens: list[str]) -> AttentionRecord:
    """One attention kind's calls (one per layer, batch of one) stacked into a record."""
    n_q, n_k = kind_calls[0]["weights"].shape[-2:]
    biases = [c["position_bias"] for c in kind_calls]
    if all(b is not None for b in biases):  # T5: [1 or batch, heads, n_q, n_k] per layer
        bias = torch.stack([b[0].expand(-1, n_q, n_k) if b.shape[0] == 1 else b[0] for b in biases]).float()
    else:
        bias = None
    return AttentionRecord(
        kind=kind,
        weights=torch.stack([c["weights"][0] for c in kind_calls]).float(),  # [layers, heads, n_q, n_k]
        queries=torch.stack([c["query"][0] for c in kind_calls]).float(),  # [layers, heads, n_q, d_head]
        keys=torch.stack([c["key"][0] for c in kind_calls]).float(),  # [layers, kv_heads, n_k, d_head]
        allowed=torch.stack([_allowed_from_model_mask(c["mask"], n_q, n_k) for c in kind_calls]),
        bias=bias,
        scales=[float(c["scaling"]) if c["scaling"] is not None else c["query"].shape[-1] ** -0.5 for c in kind_calls],
        query_tokens=query_tokens,
        key_tokens=key_tokens,
    )


def capture(
    bundle: ModelBundle,
    text: str,
    text_pair: str | None = None,
    *,
    max_tokens: int | None = None,
    fallback_tokenizer: str | None = None,
) -> Capture:
    """Run ``bundle``'s model on ``text`` (and ``text_pair`` for A/B pairs; for encoder-decoder models the pair
    is the decoder's input, defaulting to ``text``) and capture every attention call.

    ``fallback_tokenizer`` ("whitespace" or "bytes") chooses the stand-in tokenizer of a checkpoint that has none.
    """
    if not text or not text.strip():
        raise ValueError("the text is empty: type a sentence")
    limit = min(bundle.max_positions, max_tokens or bundle.max_positions)
    encoder_decoder = bundle.architecture == "encoder-decoder"
    inputs, tokens, segments, special, total, decoder_tokens = _model_inputs(
        bundle, text, text_pair, limit, fallback_tokenizer
    )
    calls: list[dict] = []
    with _CAPTURE_LOCK, torch.no_grad(), _observe_eager_attention(bundle.model, calls):
        outputs = bundle.model(**inputs, output_attentions=True)
    if not calls:
        raise RuntimeError(f"no attention call was observed in {type(bundle.model).__name__}")
    # Design pitfall: transformers returns no attentions with a non-eager implementation. Check we got them all.
    returned = getattr(outputs, "attentions", None) or getattr(outputs, "encoder_attentions", None)
    if returned is not None and len(returned) == 0:
        raise RuntimeError("the model returned no attention weights; it must be loaded with eager attention")

    result = Capture(
        model_name=bundle.name,
        text=text,
        text_pair=text_pair,
        tokens=tokens,
        segments=segments,
        special=special,
        truncated=total > len(tokens),
        n_tokens_before_truncation=total,
        decoder_tokens=decoder_tokens,
    )
    by_kind: dict[str, list[dict]] = {}
    for call in calls:
        by_kind.setdefault(_attention_kind(call["name"], encoder_decoder), []).append(call)
    for kind, kind_calls in by_kind.items():
        query_tokens = decoder_tokens if kind in ("decoder", "cross") else tokens
        key_tokens = decoder_tokens if kind == "decoder" else tokens
        result.records[kind] = _record_of(kind, kind_calls, query_tokens, key_tokens)
    return result


def replay(record: AttentionRecord, *, mask: torch.Tensor | None = None, scale: float | list[float] | None = None,
           temperature: float = 1.0):
    """Recompute every head of ``record`` from its captured Q and K with ``attnviz.attention``.

    By default it uses the model's own mask, position bias and scale, so the result should equal
    ``record.weights``. ``mask`` (bool ``[n_q, n_k]``, True = may attend) replaces the model's mask, ``scale`` its
    scaling, and ``temperature`` divides every logit (the scaled scores and the bias): that is the what-if.
    Returns weights ``[layers, heads, n_q, n_k]``.
    """
    n_rep = record.n_heads // record.n_kv_heads
    keys = repeat_kv(record.keys, n_rep)  # [layers, heads, n_k, d_head]
    allowed = record.allowed.unsqueeze(1) if mask is None else mask  # [layers, 1, n_q, n_k] or [n_q, n_k]
    scales = record.scales if scale is None else ([scale] * record.n_layers if not isinstance(scale, list) else scale)
    layers = []
    for layer in range(record.n_layers):
        bias = None if record.bias is None else record.bias[layer] / temperature
        layer_mask = allowed[layer] if allowed.dim() == 4 else allowed
        _, weights = scaled_dot_product_attention(
            record.queries[layer], keys[layer], keys[layer], layer_mask, bias=bias, scale=scales[layer] / temperature
        )
        layers.append(weights)
    return torch.stack(layers)


def head_scores(record: AttentionRecord, layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One head's raw q.k scores (unscaled, fp64) ``[n_q, n_k]`` and the model's mask ``[n_q, n_k]`` (True = may
    attend). With GQA the head reads its group's K/V head."""
    q = record.queries[layer, head].double()  # [n_q, d_head]
    k = record.keys[layer, head * record.n_kv_heads // record.n_heads].double()  # [n_k, d_head]
    return q @ k.T, record.allowed[layer]


def head_bias(record: AttentionRecord, layer: int, head: int) -> torch.Tensor | float:
    """The additive score bias the model applies to this head (T5's relative position bias), fp64, or 0."""
    return 0.0 if record.bias is None else record.bias[layer, head].double()


def is_causal(record: AttentionRecord, layer: int = 0) -> bool:
    """Whether the model's own mask for this attention is causal (no query sees a later key)."""
    n_q, n_k = record.allowed.shape[-2:]
    return n_q > 1 and not (record.allowed[layer] & ~masks.causal(n_q, n_k)).any().item()


def replay_difference(record: AttentionRecord) -> float:
    """Max |replayed - model| over all layers and heads: the proof that our attention is the model's."""
    return (replay(record) - record.weights).abs().max().item()


def word_order_experiment(bundle: ModelBundle, text: str, seed: int = 0, *, remove_positions: bool = True) -> dict:
    """Shuffle the words of ``text`` and compare first-layer self-attention before and after.

    With the model's learned position embeddings zeroed (``remove_positions``), self-attention is permutation
    equivariant: the shuffled sentence's weights are exactly the original's with rows and columns permuted.
    Returns the original and un-permuted weights ``[heads, n, n]``, the permutation and the max difference.
    """
    from attnviz.positional import learned_position_table, permutation_of_words

    found = learned_position_table(bundle.model)
    if found is None:
        raise ValueError(
            f"{bundle.name} has no learned position embeddings to remove (it uses RoPE, ALiBi or relative bias)"
        )
    if bundle.architecture != "encoder":
        raise ValueError("the word-order experiment runs on encoders (BERT-like), whose attention is not causal")
    inputs, tokens, _, special, _ = _tokenize(bundle, text, None, bundle.max_positions)
    n = len(tokens)
    keep_ends = special[0] and special[-1]
    order = permutation_of_words(n, seed, keep_ends=keep_ends)
    shuffled = {name: value[:, order] if value.dim() == 2 and value.shape[1] == n else value
                for name, value in inputs.items()}
    parameter = dict(bundle.model.named_parameters())[found[0]]

    def first_layer(model_inputs):
        calls: list[dict] = []
        with torch.no_grad(), _observe_eager_attention(bundle.model, calls):
            bundle.model(**model_inputs, output_attentions=True)
        return calls[0]["weights"][0].float()  # [heads, n, n]

    with _CAPTURE_LOCK:
        saved = parameter.detach().clone()
        try:
            if remove_positions:
                with torch.no_grad():
                    parameter.zero_()
            original = first_layer(inputs)
            permuted = first_layer(shuffled)
        finally:
            with torch.no_grad():
                parameter.copy_(saved)
    # Row i of the shuffled run is token order[i]: undo that on rows and columns.
    inverse = torch.argsort(torch.tensor(order))
    unpermuted = permuted[:, inverse][:, :, inverse]
    return {
        "tokens": tokens,
        "order": order,
        "original": original,
        "permuted": permuted,
        "unpermuted": unpermuted,
        "max_difference": (unpermuted - original).abs().max().item(),
        "parameter": found[0],
    }
