"""Every mask pattern by name, in one registry that the pages, the flash dispatch and the benchmarks share.

A pattern knows how to build its token mask (bool, True = may attend), how to say what it does with the numbers
of the chosen parameters, roughly how many (query, key) pairs it allows at a length without building the mask,
and, where the flash kernels can follow it as a rule, its :class:`~attnviz.core.masks.MaskSpec`. It also says where it
appears (the Masks page's gallery, Explore heads' what-if, the Flash page) and, for each of those places, how the
page asks for its parameters (:class:`Widget`): a new pattern is one :func:`register` call, and every page that
shows it draws its widgets from here (``attnviz.ui.pattern_widgets``). Streamlit-free: the flash code imports it.

    >>> build("sliding_causal", 6, window=3).mask.sum(-1).tolist()
    [1, 2, 3, 3, 3, 3]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

from attnviz.core import masks

# Where a pattern appears: the places a page lists patterns from (``shown_in``).
GALLERY = "gallery"  # the Masks page: the pattern over the sentence, its cost, reach and memory
WHAT_IF = "what-if"  # Explore heads' What-if tab: a real layer replayed under the pattern
FLASH = "flash"  # the Flash page: every backend under the pattern's rule (needs ``rule``)
STEP = "step-by-step"  # Attention step by step: the five steps on a few tokens, under the pattern
PLACES = (GALLERY, WHAT_IF, FLASH, STEP)

# A widget's bound: a number, or a function of the token count n and the parameters chosen before it (in order).
Bound = int | Callable[[int, dict], int]


def _resolve(bound: Bound, n: int, chosen: dict) -> int:
    return bound(n, chosen) if callable(bound) else bound


@dataclass(frozen=True)
class Widget:
    """How a page asks for one parameter of a pattern: a slider from ``low`` to ``high``, a slider over
    ``choices``, or (``box``) a number box, in column ``column`` of the page's row for the parameters."""

    parameter: str
    label: str
    low: Bound = 0
    high: Bound = 0
    default: Bound | None = None  # None: the pattern's default for the parameter
    choices: tuple[int, ...] = ()
    box: bool = False  # a number box: for a seed or a range too wide to slide along
    column: int = 0
    help: str | None = None

    def bounds(self, n: int, chosen: dict) -> tuple[int, int]:
        return _resolve(self.low, n, chosen), _resolve(self.high, n, chosen)

    def initial(self, n: int, chosen: dict, pattern_default: int) -> int:
        return pattern_default if self.default is None else _resolve(self.default, n, chosen)


@dataclass(frozen=True)
class PatternMask:
    """A built pattern: ``mask [n_q, n_k]`` bool (True = may attend), and for block patterns the block layout
    ``[n_query_blocks, n_key_blocks]``, why each block is on (``masks.BLOCK_*``) and the block size."""

    mask: torch.Tensor
    layout: torch.Tensor | None = None
    block_kind: torch.Tensor | None = None
    block_size: int | None = None


@dataclass(frozen=True, eq=False)
class MaskPattern:
    key: str
    label: str
    parameters: Mapping[str, object]  # every parameter it reads, with its default
    cost: Callable[[dict], str]  # the cost as built here, in O() terms
    describe: Callable[[dict], str]  # one line with the numbers of these parameters
    build: Callable[[int, int, dict], PatternMask]  # (n_q, n_k, params)
    allowed_pairs: Callable[[int, dict], float]  # about how many pairs at length n, without building the mask
    reach: Callable[[dict], str] = lambda p: ""  # how the receptive field grows with stacked layers
    rule: Callable[[int, int, dict], masks.MaskSpec] | None = None  # the flash kernels' form, where they have one
    square_only: bool = False
    # Where it appears (keys of PLACES) and, for each place, the widgets of its parameters there, in order.
    # Parameters a place does not ask for keep their default (or what the page gives, e.g. LSH's ``vectors``).
    places: Mapping[str, tuple[Widget, ...]] = field(default_factory=dict)


def _lsh_vectors(n: int, p: dict) -> torch.Tensor:
    """The vectors LSH hashes: the ones given, else seeded random ones ``[n, 16]``."""
    if p["vectors"] is not None:
        if len(p["vectors"]) != n:
            raise ValueError(f"LSH needs one vector per token: {len(p['vectors'])} vectors for {n} tokens")
        return p["vectors"].float()
    generator = torch.Generator().manual_seed(int(p["seed"]) + 7)
    return torch.randn(n, 16, generator=generator)


def _bigbird(n: int, p: dict) -> masks.BlockSparseMask:
    return masks.bigbird(n, p["block_size"], p["global_blocks"], p["window_blocks"], p["random_blocks"], p["seed"])


def _dilated_reach(p: dict) -> str:
    if p["dilation"] == 1:
        return f"The reach grows by W − 1 = {p['window'] - 1} on each side per layer (d = 1: a plain window)."
    return (f"The reach grows by (W − 1)·d = {(p['window'] - 1) * p['dilation']} on each side per layer, but only "
            f"tokens at a multiple of d = {p['dilation']} from it are ever reached: the gaps fill only when layers "
            "use different dilations (Longformer varies d across heads and layers).")


def _window_pairs(n: int, left: int, right: int) -> float:
    """Exactly how many pairs ``sliding_window(n, left, right)`` allows: rows near the edges lose keys."""
    left, right = min(left, n - 1), min(right, n - 1)
    return float(n) * (left + right + 1) - left * (left + 1) / 2 - right * (right + 1) / 2


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


PATTERNS: dict[str, MaskPattern] = {}


def register(pattern: MaskPattern) -> MaskPattern:
    """Add ``pattern`` to the registry (or replace the one of its key): every page that lists patterns for one
    of its places shows it from then on."""
    unknown_places = set(pattern.places) - set(PLACES)
    if unknown_places:
        raise ValueError(f"{pattern.key}: unknown places {sorted(unknown_places)}; choose among {PLACES}")
    if FLASH in pattern.places and pattern.rule is None:
        raise ValueError(f"{pattern.key}: the Flash page runs a pattern by its rule, and this one has none")
    for place, widgets in pattern.places.items():
        unknown = {widget.parameter for widget in widgets} - set(pattern.parameters)
        if unknown:
            raise ValueError(f"{pattern.key}: the {place} widgets ask for unknown parameters {sorted(unknown)}")
    PATTERNS[pattern.key] = pattern
    return pattern


def _tokens_up_to(n: int, chosen: dict) -> int:
    """A slider's top over the sentence's tokens (at least 2: a slider needs two values)."""
    return max(2, n)


def _three_or_fewer(n: int, chosen: dict) -> int:
    return min(3, n)


def _keys_on_a_side(n: int, chosen: dict) -> int:
    return max(1, n - 1)


def _block_count(n: int, chosen: dict) -> int:
    return -(-n // chosen["block_size"])


# The flash kernels' tiles are tens of tokens: their parameters come in sizes a GPU tiles well.
FLASH_WINDOWS = (16, 32, 64, 128, 256)
FLASH_BLOCKS = (16, 32, 64, 128)

register(MaskPattern(
    key="full", label="Full (BERT)", parameters={},
    cost=lambda p: "O(N²)",
    reach=lambda p: "Every token reaches every position in one layer.",
    describe=lambda p: "Every token attends to every token.",
    build=lambda n_q, n_k, p: PatternMask(masks.full(n_q, n_k)),
    allowed_pairs=lambda n, p: float(n) * n,
    rule=lambda n_q, n_k, p: masks.MaskSpec(n_q, n_k),
    places={GALLERY: (), WHAT_IF: (), FLASH: (), STEP: ()},
))
register(MaskPattern(
    key="causal", label="Causal (GPT)", parameters={},
    cost=lambda p: "O(N²/2)",
    reach=lambda p: "Every earlier token reaches a position in one layer.",
    describe=lambda p: "Each token attends to itself and every token before it.",
    build=lambda n_q, n_k, p: PatternMask(masks.causal(n_q, n_k)),
    allowed_pairs=lambda n, p: n * (n + 1) / 2,
    rule=lambda n_q, n_k, p: masks.MaskSpec(n_q, n_k, causal=True),
    places={GALLERY: (), WHAT_IF: (), FLASH: (), STEP: ()},
))
register(MaskPattern(
    key="sliding_window", label="Sliding window (left, right)",
    parameters={"left": 2, "right": 0},  # FlashAttention's window_size=(left, right)
    cost=lambda p: f"O(N·{p['left'] + p['right'] + 1})",
    reach=lambda p: (f"The reach grows by {p['left']} tokens back and {p['right']} ahead per layer."),
    describe=lambda p: (
        f"Query i sees keys i − {p['left']} … i + {p['right']}: {p['left'] + p['right'] + 1} keys per query away "
        "from the edges (FlashAttention's window_size)."
    ),
    build=lambda n_q, n_k, p: PatternMask(masks.sliding_window(n_q, p["left"], p["right"], n_k=n_k)),
    allowed_pairs=lambda n, p: _window_pairs(n, p["left"], p["right"]),
    rule=lambda n_q, n_k, p: masks.MaskSpec(n_q, n_k, window=(p["left"], p["right"])),
    places={WHAT_IF: (Widget("left", "Keys to the left", 0, lambda n, p: n, box=True),
                      Widget("right", "Keys to the right", 0, lambda n, p: n, box=True)),
            STEP: (Widget("left", "Keys to the left", 0, lambda n, p: n - 1),
                   Widget("right", "Keys to the right", 0, lambda n, p: n - 1))},
))
register(MaskPattern(
    key="sliding_causal", label="Sliding window, causal (Mistral)",
    parameters={"window": 3},  # keys per query, itself included
    cost=lambda p: "O(N·W)",
    reach=lambda p: f"The reach grows by W − 1 = {p['window'] - 1} tokens back per layer.",
    describe=lambda p: f"The last W = {p['window']} tokens, itself included: {_plural(p['window'], 'key')} per query.",
    build=lambda n_q, n_k, p: PatternMask(masks.sliding_window(n_q, p["window"] - 1, 0, n_k=n_k)),
    allowed_pairs=lambda n, p: _window_pairs(n, p["window"] - 1, 0),
    rule=lambda n_q, n_k, p: masks.MaskSpec(n_q, n_k, window=(p["window"] - 1, 0)),
    places={GALLERY: (Widget("window", "Window W (keys, itself included)", 1, _tokens_up_to, _three_or_fewer),),
            FLASH: (Widget("window", "Window W (keys)", choices=FLASH_WINDOWS, default=64),)},
))
register(MaskPattern(
    key="sliding_bidirectional", label="Sliding window, bidirectional (Longformer)",
    parameters={"radius": 1},  # keys on each side
    cost=lambda p: "O(N·(2r+1))",
    reach=lambda p: f"The reach grows by r = {p['radius']} on each side per layer.",
    describe=lambda p: (
        f"r = {p['radius']} {'key' if p['radius'] == 1 else 'keys'} on each side and itself: "
        f"{2 * p['radius'] + 1} keys per query away from the edges."
    ),
    build=lambda n_q, n_k, p: PatternMask(masks.sliding_window(n_q, p["radius"], p["radius"], n_k=n_k)),
    allowed_pairs=lambda n, p: _window_pairs(n, p["radius"], p["radius"]),
    rule=lambda n_q, n_k, p: masks.MaskSpec(n_q, n_k, window=(p["radius"], p["radius"])),
    places={GALLERY: (Widget("radius", "Keys on each side r", 0, _keys_on_a_side),)},
))
register(MaskPattern(
    key="dilated", label="Dilated sliding window (Longformer)",
    parameters={"window": 3, "dilation": 2},  # keys on each side (itself counted once), their spacing
    cost=lambda p: "O(N·(2W−1))",
    reach=_dilated_reach,
    describe=lambda p: (
        f"W = {p['window']} keys on each side spaced d = {p['dilation']} apart, itself counted once: "
        f"{2 * p['window'] - 1} keys per query reaching {(p['window'] - 1) * p['dilation']} positions either way, "
        f"the reach of a {2 * (p['window'] - 1) * p['dilation'] + 1}-key window at the cost of a "
        f"{2 * p['window'] - 1}-key one."
    ),
    build=lambda n_q, n_k, p: PatternMask(masks.dilated_sliding_window(n_q, p["window"], p["dilation"], causal=False)),
    allowed_pairs=lambda n, p: float(n + 2 * sum(max(0, n - k * p["dilation"]) for k in range(1, p["window"]))),
    square_only=True,
    places={GALLERY: (Widget("window", "Keys on each side W (itself included)", 1, _tokens_up_to, _three_or_fewer),
                      Widget("dilation", "Dilation d", 1, 8, column=1))},
))
register(MaskPattern(
    key="global_local", label="Global + local (Longformer, ETC)",
    parameters={"radius": 1, "global_tokens": 1},
    cost=lambda p: "O(N·(2r+1+2G))",
    reach=lambda p: (f"The window grows by r = {p['radius']} on each side per layer"
                     + (", and global tokens connect everything in two layers." if p["global_tokens"] else ".")),
    describe=lambda p: (
        f"A window of r = {p['radius']} on each side ({2 * p['radius'] + 1} keys), plus "
        f"{_plural(p['global_tokens'], 'global token')} that {'sees' if p['global_tokens'] == 1 else 'see'} and "
        f"{'is' if p['global_tokens'] == 1 else 'are'} seen by all."
    ),
    build=lambda n_q, n_k, p: PatternMask(
        masks.global_local(n_q, list(range(min(p["global_tokens"], n_q))), p["radius"], p["radius"])
    ),
    allowed_pairs=lambda n, p: _window_pairs(n, p["radius"], p["radius"]) + 2.0 * min(p["global_tokens"], n) * n,
    square_only=True,
    places={GALLERY: (Widget("radius", "Keys on each side r", 0, _keys_on_a_side),
                      Widget("global_tokens", "Global tokens G", 0, lambda n, p: max(1, n // 2), column=1))},
))
register(MaskPattern(
    key="bigbird", label="BigBird (global + window + random)",
    parameters={"block_size": 2, "global_blocks": 1, "window_blocks": 3, "random_blocks": 1, "seed": 0},
    cost=lambda p: "O(N·(g+w+r)·b)",
    reach=lambda p: ("Global blocks connect everything in two layers; random blocks shortcut the rest."
                     if p["global_blocks"] else "Window and random blocks spread the reach layer by layer."),
    describe=lambda p: (
        f"Blocks of b = {p['block_size']} tokens: {p['global_blocks']} global, a window of {p['window_blocks']} "
        f"blocks around the diagonal and up to {p['random_blocks']} random per non-global block row, among the blocks "
        f"it does not already see (seed {p['seed']})."
    ),
    build=lambda n_q, n_k, p: (lambda b: PatternMask(b.mask, b.layout, b.kind, b.block_size))(_bigbird(n_q, p)),
    allowed_pairs=lambda n, p: min(
        float(n) * n,
        float(n) * p["block_size"] * (p["global_blocks"] + p["window_blocks"] + p["random_blocks"])
        + float(p["global_blocks"]) * p["block_size"] * n,
    ),
    rule=lambda n_q, n_k, p: masks.MaskSpec(n_q, n_k, block_layout=_bigbird(n_q, p).layout, block_size=p["block_size"]),
    square_only=True,
    places={
        GALLERY: (Widget("block_size", "Block size b", 1, 16),
                  Widget("global_blocks", "Global blocks g", 0, _block_count,
                         lambda n, p: min(1, _block_count(n, p)), column=1),
                  Widget("window_blocks", "Window blocks w", 0, 9, column=2),
                  Widget("random_blocks", "Random blocks r", 0, 8),
                  Widget("seed", "Seed", 0, 10_000, box=True, column=2)),
        WHAT_IF: (Widget("block_size", "Block size", 1, 64, box=True),
                  Widget("window_blocks", "Window blocks", 0, 15, box=True),
                  Widget("global_blocks", "Global blocks", 0, 8, box=True, column=1),
                  Widget("random_blocks", "Random blocks", 0, 8, box=True, column=1),
                  Widget("seed", "Seed", 0, 10_000, box=True, column=1)),
        FLASH: (Widget("block_size", "Block", choices=FLASH_BLOCKS, default=64),),
    },
))
register(MaskPattern(
    key="lsh", label="LSH buckets (Reformer, simplified)",
    # vectors: [n, d] shared query/key vectors to hash (the Masks page gives the model's own); seeded random if None
    parameters={"n_buckets": 4, "n_rounds": 2, "seed": 0, "vectors": None},
    cost=lambda p: "O(N²·(1−(1−1/B)^R))",
    reach=lambda p: "The reach depends on which tokens share a bucket: similar tokens connect, others may never.",
    describe=lambda p: (
        f"Tokens attend to the tokens in their hash bucket ({p['n_buckets']} buckets) in any of "
        f"{p['n_rounds']} rounds, but not to themselves unless nothing else is left. Reformer also sorts by bucket "
        "and attends within fixed-size chunks (O(N log N)); here every same-bucket pair is kept, so the density "
        "does not fall with N."
    ),
    build=lambda n_q, n_k, p: PatternMask(masks.lsh(_lsh_vectors(n_q, p), p["n_buckets"], p["n_rounds"], p["seed"])),
    allowed_pairs=lambda n, p: float(n) * n * (1 - (1 - 1 / p["n_buckets"]) ** p["n_rounds"]),
    square_only=True,
    places={GALLERY: (Widget("n_buckets", "Buckets", choices=(2, 4, 8, 16)),
                      Widget("n_rounds", "Hash rounds", 1, 8, column=1),
                      Widget("seed", "Seed", 0, 10_000, box=True, column=2))},
))


def shown_in(place: str) -> tuple[str, ...]:
    """The keys of the patterns that appear in ``place`` (one of PLACES), in the registry's order."""
    if place not in PLACES:
        raise ValueError(f"unknown place {place!r}; choose among {PLACES}")
    return tuple(key for key, pattern in PATTERNS.items() if place in pattern.places)


def widgets(key: str, place: str) -> tuple[Widget, ...]:
    """How ``place`` asks for pattern ``key``'s parameters (empty where it asks for none)."""
    return PATTERNS[key].places.get(place, ())


def parameters_of(key: str, **params) -> dict:
    """The full parameter set of pattern ``key``: defaults, overridden by ``params`` (unknown names refused)."""
    pattern = PATTERNS.get(key)
    if pattern is None:
        raise ValueError(f"unknown mask pattern {key!r}; choose one of {list(PATTERNS)}")
    unknown = set(params) - set(pattern.parameters)
    if unknown:
        raise ValueError(f"the {pattern.label} pattern has no parameter {', '.join(sorted(unknown))}")
    return {**pattern.parameters, **params}


def build(key: str, n_q: int, n_k: int | None = None, **params) -> PatternMask:
    """Pattern ``key`` over ``n_q`` queries and ``n_k`` keys (default square)."""
    n_k = n_q if n_k is None else n_k
    chosen = parameters_of(key, **params)
    pattern = PATTERNS[key]
    if pattern.square_only and n_q != n_k:
        raise ValueError(f"the {pattern.label} pattern needs as many queries as keys (self-attention)")
    return pattern.build(n_q, n_k, chosen)


def rule(key: str, n_q: int, n_k: int | None = None, **params) -> masks.MaskSpec:
    """Pattern ``key`` as a :class:`~attnviz.core.masks.MaskSpec` for the flash kernels (which skip tiles by rule)."""
    n_k = n_q if n_k is None else n_k
    chosen = parameters_of(key, **params)
    pattern = PATTERNS[key]
    if pattern.rule is None:
        raise ValueError(f"the flash kernels have no rule for the {pattern.label} pattern")
    if pattern.square_only and n_q != n_k:
        raise ValueError(f"the {pattern.label} pattern needs as many queries as keys (self-attention)")
    return pattern.rule(n_q, n_k, chosen)


def describe(key: str, **params) -> str:
    return PATTERNS[key].describe(parameters_of(key, **params))


def reach(key: str, **params) -> str:
    """How the receptive field of pattern ``key`` grows with stacked layers, with these parameters' numbers."""
    return PATTERNS[key].reach(parameters_of(key, **params))


def cost(key: str, **params) -> str:
    return PATTERNS[key].cost(parameters_of(key, **params))


def allowed_pairs(key: str, n: int, **params) -> float:
    """About how many (query, key) pairs pattern ``key`` allows at length ``n`` (square), without building it."""
    return PATTERNS[key].allowed_pairs(n, parameters_of(key, **params))


def label(key: str) -> str:
    return PATTERNS[key].label
