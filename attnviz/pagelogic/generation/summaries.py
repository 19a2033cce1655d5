"""What the Generation page says in words and tables beside its figures: where a long prompt was cut, the text
as the model read it, the KV cache's metrics and their caption, and the numbers of the PagedAttention and Ring
attention simulations. Pure functions of a generation and its simulations (the page draws what they return)."""

from __future__ import annotations

import html
import statistics
from dataclasses import dataclass

from attnviz.core.tokens_display import markdown_literal
from attnviz.core.units import human_bytes
from attnviz.flash.ring import ring_memory
from attnviz.pagelogic.generation import decode as gen
from attnviz.pagelogic.generation import reading
from attnviz.pagelogic.generation import sequence as gen_sequence
from attnviz.pagelogic.generation import systems as gen_systems

# ---------------------------------------------------------------------------------------------------------------
# The prompt and the text


def snippet(text: str, end: bool, chars: int = 40) -> str:
    """At most ``chars`` characters of ``text`` (its end, or its start), cut at a space, on one line."""
    text = " ".join(text.split())
    if len(text) <= chars:
        return text
    part = text[-chars:] if end else text[:chars]
    cut = part.split(" ", 1)[1] if end and " " in part else (part.rsplit(" ", 1)[0] if " " in part else part)
    return cut


@dataclass(frozen=True)
class PromptCut:
    """Where a prompt too long for the model's positions was cut (``level``: "warning" or "info"), and the button
    that keeps the other end (``other_keep``: "first" or "latest")."""

    level: str
    text: str
    other_keep: str
    button_label: str
    button_help: str


def prompt_cut(fit: gen.PromptFit, tokenizer) -> PromptCut | None:
    """What the page says about a cut prompt; None when the whole prompt was read."""
    if not fit.truncated:
        return None
    room = f"this model has {fit.positions:,} positions" + (
        f" and {fit.new_tokens} go to the new tokens" if fit.room < fit.positions else "")
    if fit.keep == "first":
        tail = markdown_literal(snippet(gen_sequence.whole_characters(tokenizer, fit.ids[-24:]), end=True))
        return PromptCut(
            "warning", f"The prompt has {fit.total:,} tokens; {room}, so it reads the first {fit.room:,} (up to "
                       f"“…{tail}”) and continues from there, as Explore heads reads a long text from its start.",
            "latest", f"Keep only the latest {fit.room:,} tokens",
            "The model then continues from the end of your text; the first tokens are left out.")
    head = markdown_literal(snippet(gen_sequence.whole_characters(tokenizer, fit.ids[:24]), end=False))
    return PromptCut(
        "info", f"The prompt has {fit.total:,} tokens; {room}, so it reads the latest {fit.room:,} (from "
                f"“{head}…”): the first {fit.dropped:,} are left out.",
        "first", f"Keep the first {fit.room:,} tokens instead", "As Explore heads reads a long text: from its start.")


def text_html(generation: gen.Generation, step: int, labels: list[str], tokenizer) -> str:
    """The prompt as the model read it, then each generated token as a chip with visible marks (a space ␣, a
    newline ↵, a byte <0xNN>), the chosen step's token highlighted; for an encoder-decoder, the source the encoder
    read, then what the decoder wrote after its start token."""
    n_prompt = len(generation.prompt_ids)
    if generation.encoder_decoder:
        source = tokenizer.decode(generation.source_ids, skip_special_tokens=True)
        parts = [f'<span style="color:#555">{html.escape(source)}</span> → ']
    else:  # decoded whole: SentencePiece's spaces and byte-level BPE's multi-byte characters as they read
        parts = [html.escape(tokenizer.decode(generation.prompt_ids, skip_special_tokens=False))]
    for index, label in enumerate(labels[n_prompt:]):
        background = "#ffe0b2" if index == step else "#fff7ed"
        token_id = generation.steps[index].token_id
        parts.append(f'<b title="step {index + 1}, token id {token_id}" style="color:#c2410c; background:'
                     f'{background}; border:1px solid #fdba74; border-radius:4px; padding:0 3px; margin:0 1px; '
                     f'white-space:pre">{html.escape(label)}</b>')
    return ('<div style="font-size:1.1rem; line-height:1.8; white-space:pre-wrap; max-height:16rem; '
            f'overflow-y:auto">{"".join(parts)}</div>')


# ---------------------------------------------------------------------------------------------------------------
# The KV cache


@dataclass(frozen=True)
class CacheSummary:
    """The cache section's metrics (as shown) and caption, after one step, with the cache and without it."""

    cross_note: str | None  # an encoder-decoder's cross-attention cache, in words
    size_label: str
    size: str
    same: bool  # the same tokens without the cache
    difference: str  # the largest logit difference
    difference_help: str
    times: str  # per token, with the cache / without it
    caption: str


def float64_statement(float64: tuple[bool, float] | None, problem: str | None) -> str:
    """What the same check on a float64 copy of the model says (or why it was not made)."""
    if problem is not None:  # the generation ran; only its float64 copy could not
        return f"Not checked again in float64: the float64 copy of the model could not run ({problem})."
    if float64 is None:
        return (f"Not checked again in float64: the model has more than {gen.FLOAT64_CHECK_PARAMETERS / 1e6:.0f}M "
                "parameters, or weights offloaded to disk.")
    if float64[0]:
        return (f"On a float64 copy of the model the two runs give the same tokens and logits that differ by at most "
                f"**{float64[1]:.1e}**: what differs above is rounding, not the cache.")
    return (f"On a float64 copy of the model the two runs choose different tokens (logits differ by up to "
            f"{float64[1]:.1e} over the steps both took): a near-tie the rounding tipped, or a cache that "
            "changes the result.")


def median_step_seconds(generation: gen.Generation) -> float:
    """The median time of the steps after the first (the first also reads the prompt); 0 with one step."""
    return statistics.median(s.seconds for s in generation.steps[1:]) if len(generation.steps) > 1 else 0.0


def cache_summary(cached: gen.Generation, uncached: gen.Generation, step: int,
                  float64: tuple[bool, float] | None, float64_problem: str | None = None) -> CacheSummary:
    chosen = cached.steps[step]
    cross_note = None
    if cached.encoder_decoder:
        cross_note = (f"The cross-attention cache: the encoder's K and V in every layer, {chosen.cross_keys[0]} per "
                      f"layer, {human_bytes(chosen.cross_bytes)} in all, computed at the first step and only read "
                      "after it.")
    same, difference = gen.cache_agreement(cached, uncached)
    largest = gen.largest_logit(cached)
    with_cache, without = median_step_seconds(cached), median_step_seconds(uncached)
    return CacheSummary(
        cross_note=cross_note,
        size_label="Cache after this step" + (" (self + cross)" if cached.encoder_decoder else ""),
        size=human_bytes(chosen.cache_bytes + chosen.cross_bytes), same=same, difference=f"{difference:.1e}",
        difference_help=f"Over every step and every token of the vocabulary, with and without the cache. The "
                        f"logits reach {largest:.3g}, so this is {difference / max(largest, 1e-30):.1e} of "
                        "them: the rounding of the model's arithmetic summing in two orders (one new row "
                        "against the whole sequence). Below the figures: the same check on a float64 copy.",
        times=f"{with_cache * 1e3:.1f} / {without * 1e3:.1f} ms",
        caption=f"After step {step + 1} the cache holds K and V for {reading.cache_holds(chosen)}. With it, "
                "each step feeds only the newest token; without it, every step runs the whole sequence again: the "
                "same tokens and logits (up to rounding), more work. Times are medians over the steps after the "
                f"first, on this machine. {float64_statement(float64, float64_problem)}",
    )


# ---------------------------------------------------------------------------------------------------------------
# PagedAttention and Ring attention


def paged_metrics(demo: gen_systems.PagedDemo, max_length: int) -> list[tuple[str, str, str | None]]:
    """(label, value, help) of each metric of the paged cache, against a contiguous one of ``max_length``."""
    report = demo.cache.memory(max_length)
    return [
        ("Paged cache", human_bytes(report["paged_bytes"]), f"{report['blocks_in_use']} blocks"),
        (f"Contiguous, {max_length} tokens each", human_bytes(report["contiguous_bytes"]), None),
        ("Internal fragmentation", f"{report['fragmentation']:.0%}",
         f"{report['wasted_slots']} of {report['blocks_in_use'] * demo.cache.block_size} slots hold no token"),
        ("Through the block table", "identical" if demo.identical else "DIFFERENT", None),
    ]


def paged_caption(demo: gen_systems.PagedDemo, layer: int, max_length: int) -> str:
    return (f"{gen_systems.paged_statement(demo, layer)} A contiguous cache reserves the model's full context "
            f"({max_length} tokens) per sequence up front. Attention of a seeded query over each sample's K/V, read "
            "through its block table, gives the same bits as on contiguous tensors.")


def sliding_refusal(problem: ValueError, sample: gen.Generation) -> str:
    """Why a layer cannot be paged (its sliding cache dropped the oldest tokens), and the layers that can."""
    full = [facts.layer for facts in sample.layers if not facts.sliding]
    return f"{problem}." + (f" Layers that keep every token: {', '.join(map(str, full))}." if full else
                            " Every layer of this model slides a window shorter than this sequence.")


def ring_statement(n_tokens: int, devices: int, difference: float, layer: int) -> str:
    return (f"The {n_tokens} tokens of the generated text, split over **{devices} simulated devices**: each keeps "
            "its queries, attends them to the K/V block it holds, merges the result with the online-softmax rule, "
            f"and passes the block on. Largest difference from full causal attention: **{difference:.1e}** "
            f"(layer {layer}, the model's real Q, K, V).")


def ring_memory_rows(n_tokens: int, heads: int, kv_heads: int, head_dim: int) -> list[dict]:
    """Ring attention's memory per device and traffic per step, for this text's length and two long ones."""
    rows = []
    for n in (n_tokens, 131_072, 1_048_576):
        for p in (1, 2, 4, 8):
            if p > n:
                continue
            memory = ring_memory(n, p, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
            rows.append({"tokens N": f"{n:,}", "devices P": p, "tokens per device": f"{memory['block_tokens']:,}",
                         "memory per device": human_bytes(memory["per_device"]),
                         "sent per step by each device": human_bytes(memory["sent_per_step"]) if p > 1 else "—"})
    return rows


def ring_memory_caption(heads: int, kv_heads: int, head_dim: int) -> str:
    return (f"This model's shape ({heads} heads, {kv_heads} K/V heads, head dim {head_dim}), bf16, one layer: "
            "a device holds its queries, two K/V blocks (the one it works on and the one arriving) and its "
            "running output; per-device memory falls as 1/P while each step sends one K/V block.")
