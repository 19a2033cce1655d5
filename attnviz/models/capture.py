"""Run a model on a text (or an image) and capture what every attention call received: queries, keys, values,
the model's mask, scaling and score terms, kept in an :class:`~attnviz.models.record.AttentionRecord` per attention
kind, which replays the weights on demand (:mod:`attnviz.models.scoring`).

The model runs on its fast path (see :mod:`attnviz.models.attention_hook`). What each call gives the replay:

* **scaling**: the ``scaling`` the module passed (1/sqrt(d) when it passed none; 1 for T5, whose weights fold it);
* **mask**: transformers' SDPA mask for the call (padding, causal, sliding window), stored as a rule
  (:class:`~attnviz.core.masks.MaskSpec`: causal or full, with a window) when it is one, else as a dense boolean
  ``[n_q, n_k]`` shared by the layers that use it. A None mask (transformers' shortcut for plain causal or full) is
  rebuilt from the module's ``is_causal``;
* **position bias** (T5's relative attention bias): the ``position_bias`` tensor, added to the scaled scores
  (one tensor shared by every layer that reuses it);
* **logit soft-capping** (Gemma 2) and **attention sinks** (gpt-oss): the ``softcap`` and ``s_aux`` arguments;
* **ALiBi** (BLOOM, read by hooks: :mod:`attnviz.models.eager`): the per-head slope times the key position,
  added to the scaled scores like a position bias.

Models that compute attention in their own code take :mod:`attnviz.models.eager`'s paths: hooks (replayed the
same way, checked against the model's eager weights) or transformers' eager weights alone (``replayable`` False).
Which attention (encoder, decoder, cross) a call belongs to, and an image model's prefix tokens, come from the
type's record (:mod:`attnviz.models.architectures`).

The replay check (:mod:`attnviz.models.replay_check`) compares the replayed weights' outputs with the model's own
kernel's, so a capture holds Q, K and V only.
"""

from __future__ import annotations

import torch

from attnviz.core import masks, vision
from attnviz.core.tokens_display import readable_tokens, tokenizer_style
from attnviz.models import architectures, eager
from attnviz.models.attention_hook import AttentionCall, recording
from attnviz.models.loading import FallbackTokenizer, ModelBundle
from attnviz.models.record import AttentionRecord, Capture, LayerMask, LayerStack, dense_token_limit

CHARS_PER_TOKEN = 6  # characters of a long text read at first per token wanted (English: about 4; see tokenize)
COUNTED_CHARS = 20_000  # a text up to this long is tokenized whole, so its count of tokens is exact (the sidebar's
# sentence holds at most 5,000 characters); only a longer one is read as a prefix and counted as "more than"


def _rule_of(call: AttentionCall, n_q: int, n_k: int, cache: dict) -> LayerMask:
    """The mask of ``call`` as a rule where possible, cached by the model's mask tensor (transformers passes the
    same one to every layer of a kind), so a dense mask is checked and kept once, not per layer."""
    if call.mask is None:
        return LayerMask(masks.MaskSpec(n_q, n_k, causal=call.is_causal and n_q > 1))
    key = (id(call.kernel.attention_mask), call.sliding_window)
    if key in cache:
        return cache[key]
    dense = call.mask[..., :n_k].expand(n_q, n_k)
    candidates = [masks.MaskSpec(n_q, n_k), masks.MaskSpec(n_q, n_k, causal=True)]
    if call.sliding_window:
        candidates.append(masks.MaskSpec(n_q, n_k, causal=True, window=(call.sliding_window - 1, 0)))
    found = next((LayerMask(rule) for rule in candidates if torch.equal(rule.dense(), dense)), None)
    cache[key] = found or LayerMask(None, dense.clone())
    return cache[key]


def tokenize(bundle: ModelBundle, text: str, text_pair: str | None, max_tokens: int, fallback: str | None = None):
    """The model's inputs for ``text`` (and ``text_pair``), at most ``max_tokens`` tokens: ``(inputs, tokens,
    segments, special, total)``; ``total`` counts the whole text's tokens (negative: at least this many)."""
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
    # A long text is read as a prefix that holds more than max_tokens tokens (grown until it does), so a 400 KB
    # document is not tokenized whole to read its first 512 tokens; up to COUNTED_CHARS it is, and counted exactly.
    budget = max(max_tokens * CHARS_PER_TOKEN, COUNTED_CHARS)
    while True:
        cut = len(text) > budget or (text_pair is not None and len(text_pair) > budget)
        prefix, prefix_pair = text[:budget], None if text_pair is None else text_pair[:budget]
        full = tokenizer(prefix, prefix_pair, truncation=False, return_tensors="pt", return_token_type_ids=None)
        if not cut or full["input_ids"].shape[1] > max_tokens:
            break
        budget *= 2
    total = full["input_ids"].shape[1]
    total = -total if cut else total  # negative: at least this many
    encoded = full if abs(total) <= max_tokens else tokenizer(
        prefix, prefix_pair, truncation=True, max_length=max_tokens, return_tensors="pt", return_token_type_ids=None
    )
    ids = encoded["input_ids"][0].tolist()
    tokens = tokenizer.convert_ids_to_tokens(ids)
    special_ids = structural_special_ids(tokenizer)
    special = [i in special_ids for i in ids]
    inputs = architectures.model_inputs(bundle.model, encoded)  # a decoder gets no token types (GPT-2 would embed them)
    return inputs, tokens, _segments(encoded, bool(text_pair)), special, total


def structural_special_ids(tokenizer) -> set[int]:
    """The ids of the special tokens that give a text its structure ([CLS], [SEP], <s>, </s>, padding, [MASK]):
    the tokenizer's special ids but its unknown token, which stands for a piece of the text it could not read (an
    emoji under BERT's vocabulary), unless that id doubles as one of the others (GPT-2's <|endoftext|>)."""
    special_ids = set(tokenizer.all_special_ids)
    unknown = getattr(tokenizer, "unk_token_id", None)
    others = {getattr(tokenizer, f"{role}_token_id", None) for role in ("bos", "eos", "sep", "cls", "pad", "mask")}
    if unknown is not None and unknown not in others:
        special_ids.discard(unknown)
    return special_ids


def separator_ids(tokenizer) -> frozenset[int]:
    """The ids of the tokens that end a sentence or a text: the tokenizer's separator and end-of-text tokens
    ([SEP], </s>, <|endoftext|>); empty for a tokenizer that names neither (then every special token but the first
    counts, :func:`attnviz.core.analysis.separator_keys`)."""
    return frozenset(i for i in (getattr(tokenizer, "sep_token_id", None), getattr(tokenizer, "eos_token_id", None))
                     if isinstance(i, int))


def _segments(encoded, pair: bool) -> list[int]:
    """0 = sentence A, 1 = sentence B, per token: the tokenizer's token types, else its sequence ids (a special
    token after the first sentence's end belongs to B for the A/B filters)."""
    n = encoded["input_ids"].shape[1]
    if not pair:
        return [0] * n
    if "token_type_ids" in encoded:
        return encoded["token_type_ids"][0].tolist()
    sequence_ids = encoded.sequence_ids(0) if hasattr(encoded, "sequence_ids") else None
    if not sequence_ids:
        return [0] * n
    segments, seen_b = [], False
    for s in sequence_ids:
        seen_b = seen_b or s == 1
        segments.append(1 if (s == 1 or (s is None and seen_b)) else 0)
    return segments


def _model_inputs(bundle: ModelBundle, text: str, text_pair: str | None, limit: int, fallback: str | None):
    """Tokenize for the model: ``(inputs, tokens, segments, special, total, decoder_tokens, decoder_special)``.
    For an encoder-decoder model the pair is the decoder's input (default: the text itself)."""
    encoder_decoder = bundle.architecture == "encoder-decoder"
    inputs, tokens, segments, special, total = tokenize(
        bundle, text, None if encoder_decoder else text_pair, limit, fallback
    )
    decoder_tokens = decoder_special = None
    if encoder_decoder:
        decoder_inputs, decoder_tokens, _, decoder_special, _ = tokenize(bundle, text_pair or text, None, limit,
                                                                          fallback)
        inputs["decoder_input_ids"] = decoder_inputs["input_ids"]
        if "attention_mask" in decoder_inputs:
            inputs["decoder_attention_mask"] = decoder_inputs["attention_mask"]
    return inputs, tokens, segments, special, total, decoder_tokens, decoder_special


def record_from_calls(kind: str, calls: list[AttentionCall], query_tokens: list[str],
                      key_tokens: list[str]) -> AttentionRecord:
    """One attention kind's calls (one per layer) stacked into a record."""
    n_q, n_k = calls[0].query.shape[-2], calls[0].key.shape[-2]
    rule_cache: dict = {}
    layer_masks = [_rule_of(c, n_q, n_k, rule_cache) for c in calls]
    for call, layer_mask in zip(calls, layer_masks, strict=True):
        if layer_mask.rule is not None and call.kernel.attention_mask is not None and not call.bias_in_mask:
            # An N x N mask that is a rule is not kept: the replay check builds it again when it runs.
            rule = layer_mask.rule
            call.kernel.attention_mask = None
            call.kernel.rebuild_mask = lambda rule=rule: rule.dense()[None, None]
    del rule_cache
    return AttentionRecord(
        kind=kind,
        queries=LayerStack([c.query for c in calls]),  # [layers, heads, n_q, d_head]
        keys=LayerStack([c.key for c in calls]),  # [layers, kv_heads, n_k, d_head]
        values=LayerStack([c.value for c in calls]),  # [layers, kv_heads, n_k, d_v]
        kernels=[c.kernel for c in calls],
        layer_masks=layer_masks,
        scales=[c.scaling for c in calls],
        query_tokens=query_tokens,
        key_tokens=key_tokens,
        biases=[None if c.position_bias is None else c.position_bias.expand(-1, n_q, n_k) for c in calls],
        softcaps=[c.softcap for c in calls],
        sinks=[c.sinks for c in calls],
    )


def capture(
    bundle: ModelBundle,
    text: str,
    text_pair: str | None = None,
    *,
    max_tokens: int | None = None,
    fallback_tokenizer: str | None = None,
    check_finite: bool = True,
) -> Capture:
    """Run ``bundle``'s model on ``text`` (and ``text_pair`` for A/B pairs; for encoder-decoder models the pair
    is the decoder's input, defaulting to ``text``) and capture every attention call.

    ``fallback_tokenizer`` ("whitespace" or "bytes") chooses the stand-in tokenizer of a checkpoint that has none.
    ``check_finite=False`` leaves ``nonfinite`` empty without reading the recorded tensors: for a caller that
    checks what it reads itself (a scan checks every weight it replays, once per document).
    """
    if not text or not text.strip():
        raise ValueError("the text is empty: type a sentence")
    inputs, tokens, segments, special, total, decoder_tokens, decoder_special = _model_inputs(
        bundle, text, text_pair, tokens_read(bundle, max_tokens), fallback_tokenizer
    )
    _check_ids(bundle.model, inputs)
    style = tokenizer_style(bundle.tokenizer)
    result = Capture(
        model_name=bundle.name,
        text=text,
        text_pair=text_pair,
        tokens=tokens,
        segments=segments,
        special=special,
        truncated=abs(total) > len(tokens),
        n_tokens_before_truncation=total,
        decoder_tokens=decoder_tokens,
        decoder_special=decoder_special,
        token_ids=_ids(inputs, "input_ids"),
        decoder_token_ids=_ids(inputs, "decoder_input_ids"),
        display_tokens=readable_tokens(tokens, style),
        decoder_display_tokens=None if decoder_tokens is None else readable_tokens(decoder_tokens, style),
        token_style=style,
        separator_ids=None if isinstance(bundle.tokenizer, FallbackTokenizer) else separator_ids(bundle.tokenizer),
    )
    result.records, outputs_finite = _run_and_record(bundle, inputs, tokens, decoder_tokens, check_finite)
    show_readable(result)
    if check_finite:
        result.nonfinite = nonfinite_parts(result.records, outputs_finite)
    return result


def _ids(inputs: dict, name: str) -> list[int] | None:
    return inputs[name][0].tolist() if name in inputs else None


def show_readable(result: Capture) -> None:
    """Give each record of ``result`` the readable form of its query and key tokens (computed once, at capture)."""
    for record in result.records.values():
        record.query_display = result.display_of(record.query_tokens)
        record.key_display = result.display_of(record.key_tokens)


def tokens_read(bundle: ModelBundle, max_tokens: int | None = None) -> int:
    """The most tokens a capture reads: the model's positions, ``max_tokens``, and on the eager paths what keeps
    every layer's weights at once within DENSE_CELLS (see attnviz.models.eager). Without ``max_tokens``: what
    Explore heads reads of a text with this model."""
    limit = min(bundle.max_positions, max_tokens or bundle.max_positions)
    if bundle.capture_path != "interface":
        limit = min(limit, dense_token_limit(bundle.n_layers, bundle.n_heads))
    return limit


def _run_and_record(bundle: ModelBundle, inputs: dict, tokens: list[str], decoder_tokens: list[str] | None,
                    check_finite: bool = True) -> tuple[dict[str, AttentionRecord], bool]:
    """Run the model on ``inputs`` on its capture path: its records by attention kind, and whether its outputs
    are finite (True, unread, where ``check_finite`` is False and the fast path runs)."""
    device = device_of(bundle.model)
    inputs = {name: value.to(device) if hasattr(value, "to") else value for name, value in inputs.items()}
    encoder_decoder = bundle.architecture == "encoder-decoder"
    if bundle.capture_path == "interface":
        calls, outputs_finite = recorded_calls(bundle.model, inputs, check_finite)
    else:
        eager_weights, calls, outputs_finite = eager.run(
            bundle.model, architectures.adapter_of(bundle.model_type), inputs,
                                                         encoder_decoder)
        if not calls:  # the weights path
            return _weights_records(eager_weights, tokens, decoder_tokens), outputs_finite
        calls = [_to_cpu(call) for call in calls]
    by_kind: dict[str, list[AttentionCall]] = {}
    for call in calls:
        kind = architectures.attention_kind(call.module_name, bundle.model_type, encoder_decoder)
        by_kind.setdefault(kind, []).append(call)
    records = {kind: record_from_calls(kind, kind_calls, *_tokens_of(kind, tokens, decoder_tokens))
               for kind, kind_calls in by_kind.items()}
    return records, outputs_finite


def _tokens_of(kind: str, tokens: list[str], decoder_tokens: list[str] | None) -> tuple[list[str], list[str]]:
    """(query tokens, key tokens) of an attention kind: the decoder's queries for "decoder" and "cross", the
    decoder's keys for "decoder" only."""
    query_tokens = decoder_tokens if kind in ("decoder", "cross") else tokens
    key_tokens = decoder_tokens if kind == "decoder" else tokens
    return query_tokens, key_tokens


def _weights_records(eager_weights: dict[str, list[torch.Tensor]], tokens: list[str],
                     decoder_tokens: list[str] | None) -> dict[str, AttentionRecord]:
    """The weights path's records: what the model's own weights show, causal when no query ever weights a later
    key."""
    records = {}
    for kind, weights in eager_weights.items():
        query_tokens, key_tokens = _tokens_of(kind, tokens, decoder_tokens)
        causal = kind != "cross" and len(query_tokens) > 1 and all(
            not bool(w.triu(diagonal=1 + w.shape[-1] - w.shape[-2]).any()) for w in weights)
        records[kind] = _weights_record(kind, weights, query_tokens, key_tokens, causal)
    return records


def _check_ids(model: torch.nn.Module, inputs: dict) -> None:
    """Refuse, in words, token ids past the model's embedding table (a tokenizer that does not fit its model):
    looked up, they raise an IndexError on the CPU and break the whole process on a GPU."""
    try:
        rows = model.get_input_embeddings().num_embeddings
    except (AttributeError, NotImplementedError):
        return
    for name in ("input_ids", "decoder_input_ids"):
        ids = inputs.get(name)
        if ids is not None and ids.numel() and int(ids.max()) >= rows:
            raise ValueError(f"the tokenizer gave token id {int(ids.max()):,} for this text, but the model has only "
                             f"{rows:,} token embeddings: its tokenizer does not fit it")


def _layers_text(layers: list[int]) -> str:
    if len(layers) == 1:
        return f"layer {layers[0]}"
    return f"layers {layers[0]}–{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1)) else (
        "layers " + ", ".join(str(layer) for layer in layers[:6]) + (" …" if len(layers) > 6 else ""))


def nonfinite_parts(records: dict[str, AttentionRecord], outputs_finite: bool = True) -> list[str]:
    """What in a capture holds NaN or infinity, in words ("the queries of self-attention layers 0–5", "the model's
    outputs"): empty when everything is finite. Reads the recorded tensors (and the eager weights), not the N x N
    weights attnviz replays; a finite Q and K can still give infinite scores, which the replay check names."""
    parts = []
    for kind, record in records.items():
        where = "" if len(records) == 1 else f"{kind}-attention "
        stacks = ({"weights": record.eager} if not record.replayable else
                  {"queries": record.queries, "keys": record.keys, "values": record.values})
        for what, stack in stacks.items():
            layers = [layer for layer in range(len(stack)) if not bool(torch.isfinite(stack[layer]).all())]
            if layers:
                parts.append(f"the {what} of {where}{_layers_text(layers)}")
        biases = [b for b in (record.biases or []) if b is not None] if record.replayable else []
        if any(not bool(torch.isfinite(b).all()) for b in biases):
            parts.append(f"the {where}position bias")
    if not outputs_finite:
        parts.append("the model's outputs")
    return parts


def _finite_outputs(outputs) -> bool:
    values = outputs.values() if hasattr(outputs, "values") else (outputs if isinstance(outputs, tuple) else [outputs])
    return all(bool(torch.isfinite(v).all()) for v in values if isinstance(v, torch.Tensor) and v.is_floating_point())


def capture_image(bundle: ModelBundle, image, name: str = "image") -> Capture:
    """Run a vision transformer (``bundle.modality == "image"``) on a PIL ``image`` and capture every attention
    call; tokens are labelled ``[CLS]`` (and DeiT's ``[DIST]``, registers) and ``(row, col)`` per patch."""
    if bundle.modality != "image":
        raise ValueError(f"{bundle.name} reads text, not images")
    pixels = vision.pixel_values(bundle.image_processor, image)  # [1, 3, H, W]
    vision.check_pixels(pixels, bundle.model.config)  # before the model runs: a bounded number of patches
    dtype = next(bundle.model.parameters()).dtype
    calls, outputs_finite = recorded_calls(bundle.model, {"pixel_values": pixels.to(device=device_of(bundle.model),
                                                                                      dtype=dtype)})
    n = calls[0].query.shape[-2]
    layout = vision.layout_of(bundle.model.config, n, pixels.shape[-2], pixels.shape[-1],
                              architectures.image_prefix(bundle.model_type))
    labels = layout.labels()
    result = Capture(model_name=bundle.name, text=name, text_pair=None, tokens=labels, segments=[0] * n,
                     special=[i < len(layout.prefix) for i in range(n)], n_tokens_before_truncation=n,
                     layout=layout, image=vision.seen_image(pixels, bundle.image_processor))
    result.records["self"] = record_from_calls("self", calls, labels, labels)
    result.nonfinite = nonfinite_parts(result.records, outputs_finite)
    return result


def recorded_calls(model: torch.nn.Module, inputs: dict,
                   check_finite: bool = True) -> tuple[list[AttentionCall], bool]:
    """Run ``model`` on ``inputs`` while recording: its attention calls, in order, with their tensors on the CPU,
    and whether its outputs are finite (not read, True, with ``check_finite=False``)."""
    with torch.no_grad(), recording(model) as recorder:
        outputs = model(**inputs)
    if not recorder.calls:
        raise RuntimeError(f"no attention call was observed in {type(model).__name__}")
    return [_to_cpu(call) for call in recorder.calls], (not check_finite or _finite_outputs(outputs))


def _weights_record(kind: str, weights: list[torch.Tensor], query_tokens: list[str], key_tokens: list[str],
                    causal: bool) -> AttentionRecord:
    """A record of transformers' eager weights only (``[heads, n_q, n_k]`` fp32 on the CPU, per layer, as
    :func:`attnviz.models.eager.run` returns them): the weights path."""
    n_q, n_k = weights[0].shape[-2:]
    rule = LayerMask(masks.MaskSpec(n_q, n_k, causal=causal and n_q > 1))
    return AttentionRecord(kind=kind, queries=None, keys=None, values=None, kernels=[],
                           layer_masks=[rule] * len(weights), scales=[], query_tokens=query_tokens,
                           key_tokens=key_tokens,
                           eager=LayerStack(weights))


def device_of(model: torch.nn.Module) -> torch.device:
    """Where the model's inputs go: its embeddings' device (the first parameter's for a model split across devices)."""
    try:
        device = model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        device = next(model.parameters()).device
    return torch.device("cpu") if device.type == "meta" else device  # offloaded: accelerate moves what it needs


def _to_cpu(call: AttentionCall) -> AttentionCall:
    """Recorded tensors live on the CPU, where replay runs (a no-op on a CPU machine); the kernel call stays
    where the model is."""
    if call.query.device.type == "cpu":
        return call
    moved = {name: getattr(call, name).cpu() if isinstance(getattr(call, name), torch.Tensor) else getattr(call, name)
             for name in AttentionCall.__dataclass_fields__}
    return AttentionCall(**moved)
