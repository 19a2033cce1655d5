"""Everything the "Generation and KV cache" page computes: a decoder generating token by token with its real KV
cache, the attention of each step's query, the cache's tensors, and the same generation without a cache.

The page reads widgets, calls these and draws what they return; the tests call the same functions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from attnviz.models import architectures
from attnviz.models.layer_facts import LayerFacts, layer_facts

STRATEGIES = {"greedy": "greedy (the most likely token)", "sample": "sample (temperature, top-k, top-p)"}
TOP_SHOWN = 10


@dataclass
class Sampling:
    strategy: str = "greedy"
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1: no nucleus filter
    seed: int = 0


ALIBI_CONTEXT = 2048  # BLOOM's config names no length (ALiBi has no position table): its training length


def context_length(config) -> int:
    """How many positions a causal LM has: its position table's length (MPT: ``max_seq_len``, the length its
    ALiBi bias is built for), or BLOOM's training length."""
    return architectures.declared_positions(config) or ALIBI_CONTEXT


def sampling_distribution(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The probabilities the next token is drawn from, ``[vocab]``: softmax of logits / temperature, then only
    the ``top_k`` most likely tokens and the smallest set whose probability reaches ``top_p`` (renormalised).
    Greedy puts all the mass on the argmax."""
    logits = logits.double()
    if sampling.strategy == "greedy":
        probabilities = torch.zeros_like(logits)
        probabilities[logits.argmax()] = 1.0
        return probabilities
    if sampling.temperature <= 0:
        raise ValueError("the temperature must be above 0 (greedy is temperature → 0)")
    probabilities = torch.softmax(logits / sampling.temperature, dim=-1)
    if 0 < sampling.top_k < len(probabilities):  # exactly k tokens, even where probabilities tie at the k-th
        kept = torch.zeros_like(probabilities)
        kept[probabilities.topk(sampling.top_k).indices] = 1.0
        probabilities = probabilities * kept
    if sampling.top_p < 1:
        ordered, order = probabilities.sort(descending=True)
        before = ordered.cumsum(0) - ordered  # mass of the more likely tokens
        keep = torch.zeros_like(probabilities, dtype=torch.bool)
        keep[order[before < sampling.top_p * ordered.sum()]] = True
        probabilities = torch.where(keep, probabilities, torch.zeros_like(probabilities))
    return probabilities / probabilities.sum()


@dataclass
class Step:
    """One generated token and what produced it."""

    position: int  # the new token's position in the sequence
    token_id: int
    token: str
    top: list[tuple[int, float]]  # (token id, probability) of the TOP_SHOWN most likely tokens of the distribution
    # it was drawn from (greedy: of the model's softmax, whose top it took), most likely first
    attention: torch.Tensor  # [layers, heads, position]: the weights of the query that predicted it over every
    # earlier token, at the key's absolute position (0 where a sliding layer's window leaves the key out)
    cache_keys: list[tuple[int, ...]]  # the K tensor's shape in each layer of the cache after this step
    cache_bytes: int  # K and V of every layer
    seconds: float
    cache_values: list[tuple[int, ...]] = field(default_factory=list)  # the V tensor's shape in each layer
    layer_bytes: list[int] = field(default_factory=list)  # K and V of each layer, as the cache's tensors hold them
    # An encoder-decoder: the new query's cross-attention over the source [layers, heads, source tokens], and the
    # cross-attention cache (the encoder's K and V, computed once) per layer
    cross_attention: torch.Tensor | None = None
    cross_keys: list[tuple[int, ...]] = field(default_factory=list)
    cross_bytes: int = 0


@dataclass
class Generation:
    prompt_tokens: list[str]  # a decoder: the prompt; an encoder-decoder: the decoder's start token
    steps: list[Step] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # [vocab] of each step
    used_cache: bool = True
    kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # the cache at the end, per layer:
    # K, V [kv_heads, tokens, head_dim] (every token but the last generated one, which no step has read yet)
    source_tokens: list[str] | None = None  # an encoder-decoder: the prompt, read by the encoder
    source_ids: list[int] | None = None
    layers: tuple[LayerFacts, ...] = ()  # each (decoder self-)attention layer's facts: window, sinks, soft-capping
    prompt_ids: list[int] = field(default_factory=list)  # the ids of prompt_tokens (as read, after any fit)
    fit: PromptFit | None = None  # how much of the prompt a causal LM read (None: refused when too long)

    def pieces(self, tokenizer) -> list[str]:
        """Each generated token as it reads in the decoded text (with the space a SentencePiece or byte-level
        token carries, which decoding one token alone drops): the growth of the decoded text at each step."""
        ids, pieces, before = [], [], ""
        for step in self.steps:
            ids.append(step.token_id)
            text = tokenizer.decode(ids, skip_special_tokens=False)
            pieces.append(text[len(before):] if text.startswith(before) else step.token)
            before = text
        return pieces

    @property
    def encoder_decoder(self) -> bool:
        return self.source_tokens is not None

    @property
    def tokens(self) -> list[str]:
        return self.prompt_tokens + [step.token for step in self.steps]

    def text(self, tokenizer) -> str:
        return tokenizer.decode([step.token_id for step in self.steps])

    @property
    def ids(self) -> list[int]:
        """The whole sequence the decoder read and wrote: the prompt's ids (an encoder-decoder: its start token),
        then every generated token."""
        return self.prompt_ids + [step.token_id for step in self.steps]


def _cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(K, V) of each layer of a transformers cache object, ``[batch, kv_heads, cached tokens, head_dim]``; of an
    encoder-decoder's cache, its self-attention part."""
    cache = getattr(cache, "self_attention_cache", cache)
    return [(layer.keys, layer.values) for layer in cache.layers]


def _cross_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """An encoder-decoder cache's cross-attention part: the encoder output's K and V per layer (empty otherwise)."""
    cross = getattr(cache, "cross_attention_cache", None)
    return [] if cross is None else [(layer.keys, layer.values) for layer in cross.layers]


def _bytes(tensors) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in tensors)


def _cache_argument(model) -> str:
    """transformers renames ``past_key_values`` to ``cache`` (5.3x); use whichever this model's forward takes."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _setting(model, name: str):
    """A generation setting where ``model.generate`` looks for it: the generation config, then the model's."""
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, name, None) if source is not None else None
        if value is not None:
            return value
    return None


def decoder_start_token(model) -> int:
    """The token an encoder-decoder's decoder starts from: its decoder start token, else BOS, else padding."""
    for name in ("decoder_start_token_id", "bos_token_id", "pad_token_id"):
        value = _setting(model, name)
        if value is not None:
            token = value[0] if isinstance(value, (list, tuple)) else value
            vocabulary = int(getattr(model.config, "vocab_size", 0) or 0)
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < (vocabulary or token + 1):
                raise ValueError(f"the decoder would start from {name} = {token!r}, which is not a token of the "
                                 f"model's vocabulary of {vocabulary:,}")
            return token
    raise ValueError("this encoder-decoder names no decoder start token (decoder_start_token_id, bos, pad)")


def _generation_rules(model) -> tuple[int | None, list[int]]:
    """(the token the generation config forces first, the token ids it never lets the model choose)."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return None, []
    banned = list(getattr(config, "suppress_tokens", None) or [])
    banned += [ids[0] for ids in (getattr(config, "bad_words_ids", None) or []) if len(ids) == 1]
    return getattr(config, "forced_bos_token_id", None), sorted(set(int(i) for i in banned))


def _end_tokens(model) -> set[int]:
    value = _setting(model, "eos_token_id")
    return set(value) if isinstance(value, (list, tuple)) else ({value} if value is not None else set())


def _token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id]) if hasattr(tokenizer, "decode") else str(token_id)


KEEPS = ("first", "latest")  # which tokens of a prompt too long for the model's positions are read


@dataclass
class PromptFit:
    """How much of a prompt the model reads: every token when it fits, else the first (as Explore heads truncates)
    or the latest ``room`` tokens, the tokenizer's own special tokens at either end kept."""

    ids: list[int]  # the tokens read
    total: int  # the prompt's tokens
    room: int  # the most prompt tokens that fit: the positions less the new tokens (an encoder: its positions)
    positions: int  # the model's
    new_tokens: int
    keep: str  # "first" or "latest" (KEEPS)

    @property
    def truncated(self) -> bool:
        return len(self.ids) < self.total

    @property
    def dropped(self) -> int:
        return self.total - len(self.ids)


def _special_ends(ids: list[int], tokenizer) -> tuple[int, int]:
    """How many of ``ids`` at the start and at the end are special tokens the tokenizer added (BOS, [CLS], </s>)."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    lead = 0
    while lead < len(ids) and ids[lead] in special:
        lead += 1
    trail = 0
    while trail < len(ids) - lead and ids[len(ids) - 1 - trail] in special:
        trail += 1
    return lead, trail


def fit_prompt(model, tokenizer, prompt: str, new_tokens: int, keep: str = "first",
               max_positions: int | None = None) -> PromptFit:
    """The prompt's token ids as the model can read them with ``new_tokens`` more (a causal LM) or as its encoder
    reads them (an encoder-decoder): all of them when they fit, else the ``keep`` ("first" or "latest") of them,
    the special tokens the tokenizer puts at the start and the end kept. Refused with a reason when the prompt has
    no tokens, or ``new_tokens`` leave no position for it."""
    if keep not in KEEPS:
        raise ValueError(f"keep must be one of {KEEPS}, got {keep!r}")
    ids = [int(i) for i in tokenizer(prompt)["input_ids"]]
    lead, trail = _special_ends(ids, tokenizer)
    if len(ids) == lead + trail:
        raise ValueError("the prompt has no tokens: type a few words")
    positions = max_positions or context_length(model.config)
    room = positions if _is_encoder_decoder(model) else positions - new_tokens
    if room < lead + trail + 1:
        raise ValueError(f"{new_tokens} new tokens leave no position for the prompt: this model has {positions} "
                         "positions; ask for fewer new tokens")
    if len(ids) <= room:
        return PromptFit(ids, len(ids), room, positions, new_tokens, keep)
    body, fits = ids[lead: len(ids) - trail], room - lead - trail
    kept = body[:fits] if keep == "first" else body[len(body) - fits:]
    return PromptFit(ids[:lead] + kept + ids[len(ids) - trail:], len(ids), room, positions, new_tokens, keep)


def _prompt_ids(model, tokenizer, prompt: str, new_tokens: int, max_positions: int | None) -> torch.Tensor:
    """The prompt's token ids, ``[1, tokens]``, refused with a reason when they (and ``new_tokens`` more, for a
    causal LM) do not fit the model's positions."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    if ids.shape[1] == 0:
        raise ValueError("the prompt has no tokens: type a few words")
    limit = max_positions or context_length(model.config)
    encoder_decoder = _is_encoder_decoder(model)
    if encoder_decoder and ids.shape[1] > limit:
        raise ValueError(f"the prompt has {ids.shape[1]} tokens, more than the {limit} the encoder reads")
    if not encoder_decoder and ids.shape[1] + new_tokens > limit:
        raise ValueError(f"the prompt has {ids.shape[1]} tokens; with {new_tokens} new ones that is more than the "
                         f"{limit} positions this model has")
    return ids


def _is_encoder_decoder(model) -> bool:
    return bool(getattr(model.config, "is_encoder_decoder", False))


def _forward(model, sequence: torch.Tensor, cache, encoder_outputs, *, use_cache: bool, cache_argument: str):
    """One forward pass for the next token, with the attention weights. With a cache only the newest token is fed
    (the whole prompt on the first step); without, the whole sequence again. An encoder-decoder's decoder reads
    ``sequence`` and the encoder's outputs (``encoder_outputs`` None: a causal LM)."""
    fed = sequence if cache is None or not use_cache else sequence[:, -1:]  # [1, tokens fed]
    inputs = {"input_ids": fed} if encoder_outputs is None else {"decoder_input_ids": fed,
                                                                 "encoder_outputs": encoder_outputs}
    if use_cache:
        return model(**inputs, use_cache=True, output_attentions=True, **{cache_argument: cache})
    return model(**inputs, use_cache=False, output_attentions=True)


def _next_token_logits(output, step: int) -> torch.Tensor:
    """The last position's logits, ``[vocab]``, in fp32 at least; refused when any is NaN or infinite."""
    logits = output.logits[0, -1]
    logits = logits if logits.dtype == torch.float64 else logits.float()  # bf16/fp16: read in fp32
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(f"Not finite: the model's next-token logits at step {step + 1} hold NaN or infinity "
                         f"({int((~torch.isfinite(logits)).sum()):,} of {len(logits):,}), so no token can be drawn "
                         "from them. The checkpoint's weights or config make its arithmetic overflow.")
    return logits


def _follow_generation_rules(logits: torch.Tensor, step: int, forced_first: int | None,
                             banned: list[int]) -> torch.Tensor:
    """The logits as the generation config leaves them: banned tokens at -inf, and on the first step only the
    forced token possible (e.g. BART's <s>, mBART-50's target language)."""
    if banned:
        logits[banned] = float("-inf")
    if step == 0 and forced_first is not None:
        logits = torch.full_like(logits, float("-inf"))
        logits[forced_first] = 0.0
    return logits


def _draw(probabilities: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    if sampling.strategy == "greedy":
        return int(probabilities.argmax())
    return int(torch.multinomial(probabilities, 1, generator=generator))


def _top_tokens(logits: torch.Tensor, probabilities: torch.Tensor, sampling: Sampling) -> list[tuple[int, float]]:
    """``(token id, probability)`` of the :data:`TOP_SHOWN` most likely tokens of the distribution the token was
    drawn from, each id once (those with probability 0, e.g. cut by top-k, left out). Greedy draws from a one-hot:
    show the model's own distribution it took the top of."""
    shown = torch.softmax(logits.double(), -1) if sampling.strategy == "greedy" else probabilities
    top = shown.topk(min(TOP_SHOWN, len(shown)))
    return [(int(i), float(p)) for p, i in zip(top.values, top.indices, strict=True) if p > 0]


def _at_absolute_positions(rows: list[torch.Tensor], keys: int) -> torch.Tensor:
    """Each layer's row of weights ``[heads, n_k]`` over the last ``n_k`` of ``keys`` keys (a sliding layer's
    cache returns only its window) placed at the keys' absolute positions: ``[layers, heads, keys]``, 0 before."""
    placed = torch.zeros(len(rows), rows[0].shape[0], keys)
    for layer, row in enumerate(rows):
        if row.shape[-1] > keys:
            raise ValueError(f"layer {layer} returned weights over {row.shape[-1]} keys; the sequence has {keys}")
        placed[layer, :, keys - row.shape[-1]:] = row.float()
    return placed


def _newest_query_attention(output, encoder_decoder: bool, keys: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights of the query that predicted the token: over the decoder's own ``keys`` earlier tokens
    ``[layers, heads, keys]`` (at their absolute positions), and an encoder-decoder's over the source
    ``[layers, heads, source tokens]`` (None for a causal LM)."""
    own = output.decoder_attentions if encoder_decoder else output.attentions
    attention = _at_absolute_positions([layer[0, :, -1] for layer in own], keys)
    if not encoder_decoder:
        return attention, None
    return attention, torch.stack([layer[0, :, -1].float() for layer in output.cross_attentions])


def _step_record(output, cache, tokenizer, *, token_id: int, position: int, top: list[tuple[int, float]],
                 seconds: float, encoder_decoder: bool) -> Step:
    """What :class:`Step` shows of one step: the token, its attention, and the cache's tensors after it."""
    attention, cross = _newest_query_attention(output, encoder_decoder, keys=position)
    tensors = _cache_tensors(cache) if cache is not None else []
    crossing = _cross_tensors(cache) if cache is not None else []
    return Step(
        position=position, token_id=token_id, token=_token_text(tokenizer, token_id), top=top,
        attention=attention,
        cache_keys=[tuple(k.shape) for k, _ in tensors],
        cache_values=[tuple(v.shape) for _, v in tensors],
        layer_bytes=[_bytes([pair]) for pair in tensors],
        cache_bytes=_bytes(tensors),
        seconds=seconds,
        cross_attention=cross,
        cross_keys=[tuple(k.shape) for k, _ in crossing],
        cross_bytes=_bytes(crossing),
    )


@torch.no_grad()
def generate(model, tokenizer, prompt: str, new_tokens: int, sampling: Sampling, *, use_cache: bool = True,
             max_positions: int | None = None, progress=None, keep: str | None = None) -> Generation:
    """Generate up to ``new_tokens`` tokens, one forward pass a token, recording each step's top tokens, the
    attention of the query that predicted it (every layer and head, over all earlier keys), and the cache's
    tensors. Without ``use_cache``, every step runs the whole sequence again (the same tokens and logits, slower).
    ``model``: a causal LM (it continues ``prompt``), or an encoder-decoder (the encoder reads ``prompt`` once;
    the decoder writes from its start token until its end-of-sequence token, and each step also records the new
    query's cross-attention), with eager attention. The model's generation config is followed as
    ``model.generate`` follows it: its forced first token and its suppressed tokens. A prompt too long for the
    model's positions (with ``new_tokens`` more) is refused, or with ``keep`` ("first", "latest") cut to fit
    (:func:`fit_prompt`)."""
    fit = None
    if keep is None:
        ids = _prompt_ids(model, tokenizer, prompt, new_tokens, max_positions)  # [1, prompt tokens]
    else:
        fit = fit_prompt(model, tokenizer, prompt, new_tokens, keep, max_positions)
        ids = torch.tensor([fit.ids])
    encoder_decoder = _is_encoder_decoder(model)
    generator = torch.Generator().manual_seed(sampling.seed)
    forced_first, banned = _generation_rules(model)
    end_tokens = _end_tokens(model) if encoder_decoder else set()
    source = encoder_outputs = None
    if encoder_decoder:  # the prompt goes to the encoder, once (with or without the decoder's KV cache)
        source = ids
        ids = torch.tensor([[decoder_start_token(model)]])
        encoder_outputs = model.get_encoder()(input_ids=source)
    result = Generation([_token_text(tokenizer, int(i)) for i in ids[0]], used_cache=use_cache,
                        source_tokens=None if source is None else [_token_text(tokenizer, int(i)) for i in source[0]],
                        source_ids=None if source is None else source[0].tolist(), prompt_ids=ids[0].tolist(),
                        fit=fit)
    cache, sequence = None, ids  # sequence: [1, tokens so far]
    cache_argument = _cache_argument(model)
    for step in range(new_tokens):
        started = time.perf_counter()
        output = _forward(model, sequence, cache, encoder_outputs, use_cache=use_cache, cache_argument=cache_argument)
        if use_cache:
            cache = output.past_key_values
        logits = _follow_generation_rules(_next_token_logits(output, step), step, forced_first, banned)
        probabilities = sampling_distribution(logits, sampling)
        token_id = _draw(probabilities, sampling, generator)
        seconds = time.perf_counter() - started
        result.steps.append(_step_record(output, cache, tokenizer, token_id=token_id, position=sequence.shape[1],
                                         top=_top_tokens(logits, probabilities, sampling),
                                         seconds=seconds, encoder_decoder=encoder_decoder))
        result.logits.append(logits)
        sequence = torch.cat([sequence, torch.tensor([[token_id]])], dim=1)
        if progress:
            progress(step + 1, new_tokens)
        if not result.layers:
            result.layers = layer_facts(model.config, model, n_layers=len(result.steps[0].attention))
        if token_id in end_tokens:
            break  # the decoder has finished its output
    if cache is not None:
        result.kv = [(k[0].detach().clone(), v[0].detach().clone()) for k, v in _cache_tensors(cache)]
    return result


def cache_agreement(with_cache: Generation, without_cache: Generation) -> tuple[bool, float]:
    """Whether both generations chose the same tokens, and the largest logit difference over the steps both took
    (where both logits are finite: a forced or suppressed token is -inf in both). Runs that stop at different
    lengths (one reached end-of-sequence first) are not the same."""
    same = [s.token_id for s in with_cache.steps] == [s.token_id for s in without_cache.steps]
    difference = 0.0
    for a, b in zip(with_cache.logits, without_cache.logits, strict=False):  # the steps both took
        finite = torch.isfinite(a) & torch.isfinite(b)
        same &= torch.equal(finite, torch.isfinite(a))  # the same tokens ruled out
        if finite.any():
            difference = max(difference, float((a[finite] - b[finite]).abs().max()))
    return same, difference


def largest_logit(generation: Generation) -> float:
    """The largest finite |logit| over every step (the scale a logit difference is rounding against)."""
    return max((float(logits[torch.isfinite(logits)].abs().max()) for logits in generation.logits
                if torch.isfinite(logits).any()), default=0.0)


def float64_copy(model):
    """A float64 copy of ``model`` that runs: a mixture of experts whose experts run as one grouped matrix product
    (``torch._grouped_mm``, transformers' default for gpt-oss, Mixtral, Qwen-MoE...) has no float64 kernel
    ("Expected mat_a to be Float32, BFloat16 or Float16"), so the copy's experts run one by one ("eager"), the
    same sums in float64. ``model`` itself is left as it was."""
    import copy

    double = copy.deepcopy(model).double()
    setter = getattr(double, "set_experts_implementation", None)
    can_set = getattr(double, "_can_set_experts_implementation", None)
    if setter is not None and can_set is not None and can_set():
        setter("eager")
    return double


FLOAT64_CHECK_PARAMETERS = 10_000_000  # models up to this size are also checked in float64 (a copy, seconds)


def float64_cache_agreement(model, tokenizer, prompt: str, new_tokens: int, sampling: Sampling,
                            keep: str | None = None) -> tuple[bool, float] | None:
    """:func:`cache_agreement` of the same generation run on a float64 copy of ``model``, with and without the
    cache: in float64 the two orders of summation agree far below 1e-5, so what is left of the model's own dtype's
    difference is rounding. None for a model above :data:`FLOAT64_CHECK_PARAMETERS` (or one whose weights are not
    all on hand, e.g. offloaded to disk)."""
    parameters = list(model.parameters())
    if sum(p.numel() for p in parameters) > FLOAT64_CHECK_PARAMETERS or any(
            p.device.type == "meta" for p in parameters):
        return None
    double = float64_copy(model)
    return cache_agreement(generate(double, tokenizer, prompt, new_tokens, sampling, keep=keep),
                           generate(double, tokenizer, prompt, new_tokens, sampling, use_cache=False, keep=keep))
