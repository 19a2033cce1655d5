"""Activation patching (attnviz.interventions.activation_patching) against an independent reference: transformers'
EAGER models (a separate copy with the same weights) patched by hand-written PyTorch hooks, one cell per forward,
no batching. Where each hook sits:

- resid: a forward pre-hook on block l (its hidden states); the row after the last block, a pre-hook on the final
  norm (GPT-2 ``ln_f``, Llama ``norm``) or, for BERT (no final norm), on the masked-LM head ``cls``;
- attn / mlp: a forward hook on the output projection (``c_proj``, ``o_proj``, ``attention.output.dense``) / on the
  MLP (``mlp``; BERT ``output.dense``);
- head: a pre-hook on the output projection replacing one head's columns of its input;
- q / k / v: a forward hook on the projection's output (GPT-2: the fused ``c_attn``, sliced per head; Llama
  ``q_proj`` / ``k_proj`` / ``v_proj``, i.e. BEFORE RoPE, where attnviz patches after it: the rotation depends only on
  the position, so patching one position before or after it is the same; BERT ``query`` / ``key`` / ``value``);
- pattern: transformers' eager attention has no hook point for its weights, so the reference rebuilds the patched
  head's output instead: the source run's weights (transformers' own ``output_attentions=True``) times the values
  of the run being patched (read by a forward hook on the value projection in the same forward), put in by a
  pre-hook on the output projection. Nothing of attnviz's written-out softmax is reused.

Three shapes: the bundled tiny GPT-2, a tiny Llama with grouped-query attention (4 heads, 2 K/V heads) and a
BERT-shaped masked LM (the metric read at the mask's position), all in float64 (so the comparison is tight); the
shipped float32 GPT-2 once more at 1e-4. Then what must hold whatever the weights (clean into clean, the ends of
the residual stream, causality), and the spread over examples."""

import contextlib
import copy
import functools
import math
from dataclasses import dataclass

import pytest
import torch
import transformers

import attnviz.models.attention_hook  # noqa: F401  (registers the "attnviz" attention with transformers)
from attnviz.core import circuits
from attnviz.interventions import activation_patching as ap
from attnviz.interventions import edits
from attnviz.interventions.patching import induction_prompts
from attnviz.models.shipped import BUNDLED_GPT_DIR
from attnviz.models.with_heads import load_causal_lm

SITES = ("resid", "attn", "mlp", "head", "q", "k", "v", "pattern")
HEAD_SITES = ("head", "q", "k", "v", "pattern")
METRICS = ("logit difference", "probability", "loss")
FAMILIES = ("gpt2", "llama", "bert")
TIGHT = 1e-9  # float64 models: attnviz's batched rows against one forward per cell
# attnviz writes a patched pattern's softmax out in float32 even for a float64 model (attention_hook._by_pattern),
# and transformers' eager Llama takes its softmax in float32 whatever the model's dtype
LOOSE = 1e-5


def within(site: str) -> float:
    """How close attnviz's own numbers must be to what they must equal."""
    return LOOSE if site == "pattern" else TIGHT


def against_eager(name: str, site: str) -> float:
    """How close attnviz's numbers must be to the eager reference's."""
    return LOOSE if name == "llama" else within(site)


# ---------------------------------------------------------------------------------------------- the eager reference
@dataclass
class Ref:
    """An eager model and the modules a hand-written hook patches each site at."""

    model: torch.nn.Module
    blocks: list
    final: torch.nn.Module  # its input: the residual stream out of the last block
    out_proj: list  # per layer: the module that mixes the heads (its input: [1, n, heads * d_head])
    mlps: list
    projections: list  # per layer: {"q" | "k" | "v": (module, the column of head 0 in its output)}
    heads: int
    kv_heads: int
    d_head: int

    @property
    def layers(self) -> int:
        return len(self.blocks)

    def heads_at(self, site: str) -> int:
        return self.kv_heads if site in ("k", "v") else self.heads

    def columns(self, site: str, layer: int, head: int) -> slice:
        start = (0 if site in ("head", "pattern") else self.projections[layer][site][1]) + head * self.d_head
        return slice(start, start + self.d_head)


def gpt2_ref(model) -> Ref:
    blocks, d_model = model.transformer.h, model.config.n_embd
    heads = model.config.n_head
    return Ref(model, list(blocks), model.transformer.ln_f, [block.attn.c_proj for block in blocks],
               [block.mlp for block in blocks],
               [{which: (block.attn.c_attn, index * d_model) for index, which in enumerate("qkv")} for block in blocks],
               heads, heads, d_model // heads)


def llama_ref(model) -> Ref:
    layers, config = model.model.layers, model.config
    return Ref(model, list(layers), model.model.norm, [layer.self_attn.o_proj for layer in layers],
               [layer.mlp for layer in layers],
               [{which: (getattr(layer.self_attn, f"{which}_proj"), 0) for which in "qkv"} for layer in layers],
               config.num_attention_heads, config.num_key_value_heads, config.hidden_size // config.num_attention_heads)


def bert_ref(model) -> Ref:
    layers, config = model.bert.encoder.layer, model.config
    names = {"q": "query", "k": "key", "v": "value"}
    return Ref(model, list(layers), model.cls, [layer.attention.output.dense for layer in layers],
               [layer.output.dense for layer in layers],
               [{which: (getattr(layer.attention.self, name), 0) for which, name in names.items()} for layer in layers],
               config.num_attention_heads, config.num_attention_heads,
               config.hidden_size // config.num_attention_heads)


def _first(value):
    return value[0] if isinstance(value, tuple) else value


@contextlib.contextmanager
def hooked(ref: Ref, site: str, layer: int, edit):
    """Forwards of ``ref.model`` inside the block hand the site's tensor at ``layer`` to ``edit`` and go on with
    what it returns: ``[1, n, d_model]`` (resid, attn, mlp), the output projection's input ``[1, n, heads * d_head]``
    (head, pattern) or the projection's output (q, k, v; GPT-2's holds all three)."""
    if site == "resid":
        module = ref.blocks[layer] if layer < ref.layers else ref.final

        def pre(_, args, kwargs):
            if args:
                return (edit(args[0]), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": edit(kwargs["hidden_states"])}

        handle = module.register_forward_pre_hook(pre, with_kwargs=True)
    elif site in ("head", "pattern"):
        handle = ref.out_proj[layer].register_forward_pre_hook(lambda _, args: (edit(args[0]), *args[1:]))
    else:
        module = {"attn": ref.out_proj, "mlp": ref.mlps}[site][layer] if site in ("attn", "mlp") else \
            ref.projections[layer][site][0]

        def post(_, __, output):
            edited = edit(_first(output))
            return (edited, *output[1:]) if isinstance(output, tuple) else edited

        handle = module.register_forward_hook(post)
    try:
        yield
    finally:
        handle.remove()


def forward(ref: Ref, ids: list[int], at: int, **kwargs):
    with torch.no_grad():
        out = ref.model(input_ids=torch.tensor([ids]), **kwargs)
    return out.logits[0, at].double(), out


def capture(ref: Ref, site: str, ids: list[int]) -> tuple[dict[int, torch.Tensor], list[torch.Tensor] | None]:
    """One forward of ``ids``: the site's tensor at every layer (resid: every row), and for the pattern the eager
    attention weights ``[heads, n, n]`` per layer."""
    kept: dict[int, torch.Tensor] = {}

    def keep(tensor, layer):
        kept[layer] = tensor.detach().clone()
        return tensor

    with contextlib.ExitStack() as stack:
        for layer in range(ref.layers + (site == "resid")):
            stack.enter_context(hooked(ref, "head" if site == "pattern" else site, layer,
                                       functools.partial(keep, layer=layer)))
        _, out = forward(ref, ids, -1, output_attentions=site == "pattern")
    if site != "pattern":
        return kept, None
    assert len(out.attentions) == ref.layers
    return kept, [weights[0].double() for weights in out.attentions]


def patched_logits(ref: Ref, site: str, source: dict, weights, target: list[int], layer: int, head: int | None,
                   position: int | None, at: int) -> torch.Tensor:
    """One forward of ``target`` with one cell set to the source's: ``[vocab]`` at position ``at``."""
    rows = slice(None) if position is None else position
    if site == "pattern":
        group = ref.heads // ref.kv_heads
        value_columns = ref.columns("v", layer, head // group)
        values = {}

        def read_values(tensor):  # the value projection's output in this forward: [1, n, ...]
            values["v"] = tensor
            return tensor

        def put_output(merged):  # [1, n, heads * d_head]
            merged = merged.clone()
            rebuilt = weights[layer][head, rows].to(merged.dtype) @ values["v"][0, :, value_columns]
            merged[0, rows, ref.columns("head", layer, head)] = rebuilt
            return merged

        with hooked(ref, "v", layer, read_values), hooked(ref, "head", layer, put_output):
            return forward(ref, target, at)[0]

    def put(tensor):
        tensor = tensor.clone()
        index = (0, rows) if site in ("resid", "attn", "mlp") else (0, rows, ref.columns(site, layer, head))
        tensor[index] = source[layer][index]
        return tensor

    with hooked(ref, site, layer, put):
        return forward(ref, target, at)[0]


def metric(name: str, logits: torch.Tensor, answer: int, foil: int) -> float:
    if name == "logit difference":
        return float(logits[answer] - logits[foil])
    log_probability = float(torch.log_softmax(logits, dim=-1)[answer])
    return math.exp(log_probability) if name == "probability" else -log_probability


def cells(ref: Ref, site: str, n: int, by_position: bool, positions=None) -> list[tuple[tuple, int, int | None,
                                                                                        int | None]]:
    """(index in the map's grid, layer, head, position) of the cells to check, in the map's order."""
    positions = range(n) if positions is None else positions
    if site in ("resid", "attn", "mlp"):
        return [((layer, p), layer, None, p) for layer in range(ref.layers + (site == "resid")) for p in positions]
    heads = range(ref.heads_at(site))
    if by_position:
        return [((layer, head, p), layer, head, p) for layer in range(ref.layers) for head in heads for p in positions]
    return [((layer, head), layer, head, None) for layer in range(ref.layers) for head in heads]


@dataclass
class Expected:
    clean: float
    corrupted: float
    foil: int
    values: dict  # grid index -> the metric with the cell patched
    shares: dict


def reference_ends(ref: Ref, example: ap.Example, name: str) -> tuple[float, float, int]:
    """The metric on the clean and the corrupted run (one forward each), and the foil."""
    at = example.position
    clean_logits, corrupted_logits = forward(ref, example.clean, at)[0], forward(ref, example.corrupted, at)[0]
    foil = example.foil
    if foil is None:  # the corrupted run's most likely token other than the answer
        foil = next(token for token in corrupted_logits.argsort(descending=True).tolist() if token != example.answer)
    clean, corrupted = (metric(name, logits, example.answer, foil) for logits in (clean_logits, corrupted_logits))
    return clean, corrupted, foil


def share(value: float, clean: float, corrupted: float, direction: str) -> float:
    """Denoising: how much of the gap the patch brings back; noising: how much of it the patch takes away."""
    return (value - corrupted if direction == "denoising" else clean - value) / (clean - corrupted)


def reference(ref: Ref, example: ap.Example, site: str, direction: str, name: str, checked) -> Expected:
    """The map's cells in ``checked`` by brute force: one eager forward per cell."""
    clean, corrupted, foil = reference_ends(ref, example, name)
    source_ids, target_ids = ((example.clean, example.corrupted) if direction == "denoising"
                              else (example.corrupted, example.clean))
    source, weights = capture(ref, site, source_ids)
    values, shares = {}, {}
    for index, layer, head, position in checked:
        logits = patched_logits(ref, site, source, weights, target_ids, layer, head, position, example.position)
        values[index] = metric(name, logits, example.answer, foil)
        shares[index] = share(values[index], clean, corrupted, direction)
    return Expected(clean, corrupted, foil, values, shares)


def assert_matches(result: ap.PatchMap, expected: Expected, tolerance: float, row: int = 0) -> None:
    gap = abs(expected.clean - expected.corrupted)
    assert float(result.clean[row]) == pytest.approx(expected.clean, abs=tolerance)
    assert float(result.corrupted[row]) == pytest.approx(expected.corrupted, abs=tolerance)
    assert result.foils[row] == expected.foil
    assert expected.values
    for index, value in expected.values.items():
        assert float(result.values[(row, *index)]) == pytest.approx(value, abs=tolerance), index
        assert float(result.shares[(row, *index)]) == pytest.approx(expected.shares[index],
                                                                     abs=tolerance / gap), index


# ------------------------------------------------------------------------------------------------------ the models
def _roughen(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Norm gains and all biases away from their init, so that no part of the computation is an identity."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim == 1:
                noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
                is_gain = ("norm" in name.lower() or "ln_" in name) and name.endswith("weight")
                parameter.copy_(1 + 0.3 * noise if is_gain else 0.1 * noise)
    return model.eval()


def _switched(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the eager model (same weights) whose attention runs through attnviz's function."""
    other = copy.deepcopy(model)
    other.set_attn_implementation("attnviz")
    return other


VOCAB = 64
MASK = 4  # the tiny BERT's mask token


@dataclass
class Family:
    ref: Ref
    model: torch.nn.Module  # the attnviz copy
    example: ap.Example
    changed: int  # the one position where clean and corrupted differ
    causal: bool
    pool: list[int] | None = None  # the tokenizer's ordinary tokens (GPT-2)


def _random_example(ref: Ref, seed: int, n: int, changed: int, position: int = -1,
                    mask: int | None = None) -> ap.Example:
    """Random tokens; the corrupted prompt differs at ``changed``; the answer: the clean run's top token."""
    generator = torch.Generator().manual_seed(seed)
    clean = torch.randint(5, VOCAB, (n,), generator=generator).tolist()
    if mask is not None:
        clean[position] = mask
    corrupted = list(clean)
    corrupted[changed] = 5 + (clean[changed] - 5 + 17) % (VOCAB - 5)
    answer = int(forward(ref, clean, position)[0].argmax())
    return ap.Example(clean, corrupted, answer, None, position)


SHIPPED = "gpt2-float32"  # the tiny GPT as shipped


@functools.cache
def family(name: str) -> Family:
    """Each model once (float64, but for :data:`SHIPPED`): the eager reference and attnviz's copy, and one
    example."""
    if name in ("gpt2", SHIPPED):
        eager, _ = load_causal_lm(BUNDLED_GPT_DIR)
        model, tokenizer = edits.editable_lm(BUNDLED_GPT_DIR)  # loaded on its own: only the weights are shared
        if name == "gpt2":
            eager, model = eager.double(), model.double()
        pool = circuits.ordinary_token_ids(tokenizer)
        prompts = induction_prompts(pool, 12, seed=1 if name == "gpt2" else 4, bos=0)
        example = ap.Example(list(prompts.clean), list(prompts.corrupted), prompts.answer, prompts.foil)
        return Family(gpt2_ref(eager.eval()), model.eval(), example, prompts.changed[0], True, pool)
    torch.manual_seed(0)
    if name == "llama":
        config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                          max_position_embeddings=64, initializer_range=0.1)
        eager = _roughen(transformers.LlamaForCausalLM(config).double(), 2)
        eager.set_attn_implementation("eager")
        ref = llama_ref(eager)
        return Family(ref, _switched(eager), _random_example(ref, 5, 14, 5), 5, True)
    config = transformers.BertConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                                     vocab_size=VOCAB, max_position_embeddings=64, initializer_range=0.1)
    eager = _roughen(transformers.BertForMaskedLM(config).double(), 3)
    eager.set_attn_implementation("eager")
    ref = bert_ref(eager)
    return Family(ref, _switched(eager), _random_example(ref, 6, 12, 3, position=8, mask=MASK), 3, False)


def test_the_models_agree_before_any_patch():
    """The two copies of each model give the same logits, and attnviz's attention really runs in one of them."""
    for name in FAMILIES:
        built = family(name)
        ids = torch.tensor([built.example.clean])
        assert built.model.config._attn_implementation == "attnviz"
        assert built.ref.model.config._attn_implementation == "eager"
        with torch.no_grad():
            ours, theirs = built.model(input_ids=ids).logits, built.ref.model(input_ids=ids).logits
        assert ours.dtype == theirs.dtype == torch.float64
        torch.testing.assert_close(ours, theirs, atol=against_eager(name, "resid"), rtol=0)
        assert ap.ends(built.model, built.example, "logit difference").clean != \
            ap.ends(built.model, built.example, "logit difference").corrupted


# -------------------------------------------------------------------------------------------- every site, by hand
def _metric_for(name: str, site: str, shift: int) -> str:
    return METRICS[(FAMILIES.index(name) + SITES.index(site) + shift) % len(METRICS)]


@pytest.mark.parametrize("site", SITES)
@pytest.mark.parametrize("name", FAMILIES)
def test_denoising_every_cell_matches_hooks_by_hand(name, site):
    """Denoising, each site of each model, every cell (head sites: every head, and by position at four positions
    each), against one eager forward per cell; the metric rotates over the three with the site."""
    built = family(name)
    example, n = built.example, len(built.example.clean)
    chosen = _metric_for(name, site, 0)
    tolerance = against_eager(name, site)
    if site in HEAD_SITES:
        result = ap.patch_map(built.model, [example], site, metric=chosen)
        assert result.values.shape == (1, built.ref.layers, built.ref.heads_at(site)) and not result.by_position
        assert_matches(result, reference(built.ref, example, site, "denoising", chosen,
                                         cells(built.ref, site, n, False)), tolerance)
        positions = sorted({0, built.changed, built.changed + 1, n - 1, example.position % n})
        result = ap.patch_map(built.model, [example], site, metric=chosen, by_position=True)
        assert result.values.shape == (1, built.ref.layers, built.ref.heads_at(site), n) and result.by_position
        checked = cells(built.ref, site, n, True, positions)
    else:
        result = ap.patch_map(built.model, [example], site, metric=chosen, by_position=True)  # ignored here
        rows = built.ref.layers + (site == "resid")
        assert result.values.shape == (1, rows, n) and not result.by_position and len(result.rows) == rows
        checked = cells(built.ref, site, n, False)
    assert_matches(result, reference(built.ref, example, site, "denoising", chosen, checked), tolerance)
    assert result.site == site and result.direction == "denoising" and result.metric == chosen


@pytest.mark.parametrize("site", SITES)
@pytest.mark.parametrize("name", FAMILIES)
def test_noising_every_cell_matches_hooks_by_hand(name, site):
    """Noising (the corrupted run's activation put into the clean run), every cell of the per-head map (resid,
    attn, mlp: every layer and position), another metric than the denoising test's."""
    built = family(name)
    example, n = built.example, len(built.example.clean)
    chosen = _metric_for(name, site, 1)
    result = ap.patch_map(built.model, [example], site, direction="noising", metric=chosen)
    expected = reference(built.ref, example, site, "noising", chosen, cells(built.ref, site, n, False))
    assert_matches(result, expected, against_eager(name, site))
    assert result.direction == "noising"


def test_the_shipped_float32_gpt_matches_eager_hooks_to_1e_4():
    """The tiny GPT as shipped (float32, attnviz's fast SDPA path against eager attention), logit difference."""
    built = family(SHIPPED)
    model, ref, example, changed = built.model, built.ref, built.example, built.changed
    n = len(example.clean)
    for site, by_position, positions in [("resid", False, None), ("head", True, [changed, n - 1]),
                                         ("v", True, [changed]), ("pattern", False, None), ("mlp", False, None)]:
        for direction in ("denoising", "noising"):
            result = ap.patch_map(model, [example], site, direction=direction, by_position=by_position)
            expected = reference(ref, example, site, direction, "logit difference",
                                 cells(ref, site, n, by_position, positions))
            assert_matches(result, expected, 1e-4)


# ----------------------------------------------------------------------------------------- what must hold anyway
@pytest.mark.parametrize("name", [*FAMILIES, SHIPPED])
def test_patching_clean_into_clean_changes_nothing(name):
    """With corrupted == clean there is no gap: every share is NaN (nothing to be a share of), every value the clean
    metric, whatever rounding a batch brings."""
    built = family(name)
    example = built.example
    same = ap.Example(example.clean, list(example.clean), example.answer, example.foil, example.position)
    for site in SITES:
        for direction in ("denoising", "noising"):
            result = ap.patch_map(built.model, [same], site, direction=direction)
            if not bool(result.shares.isnan().all()):
                finite = result.shares[~result.shares.isnan()]
                pytest.fail(f"{site}, {direction}: the ends differ by {float(result.clean[0] - result.corrupted[0])!r}"
                            f" (one prompt twice in one batch), so {finite.numel()} shares are not NaN but noise over"
                            f" noise, from {float(finite.min()):.3g} to {float(finite.max()):.3g}")
            expected = torch.full_like(result.values, float(result.clean[0]))
            torch.testing.assert_close(result.values, expected, atol=1e-4 if name == SHIPPED else within(site), rtol=0)
            assert bool(ap.spread(result.shares).mean.isnan().all())


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_the_ends_of_the_residual_stream_restore_everything_or_nothing(name, direction):
    """Derived from the architecture alone, whatever the weights (share 1: the patched run is the source run at the
    metric's position; share 0: it is the target run):
    - into layer 0, only the changed position differs between the runs (the embeddings are position-wise): there
      share 1 exactly, elsewhere 0;
    - out of the last layer, only the metric's position reaches the logits read (the final norm and the unembedding,
      or BERT's masked-LM head, are position-wise): there 1, elsewhere 0;
    - in a causal model, no position before the changed one differs at any site (share 0 in every map there); in
      BERT they do differ (bidirectional), so some cell there moves the metric."""
    built = family(name)
    example, changed = built.example, built.changed
    n, at = len(example.clean), example.position % len(example.clean)
    resid = ap.patch_map(built.model, [example], "resid", direction=direction, metric="loss").shares[0]
    others = [p for p in range(n) if p != changed]
    assert float(resid[0, changed]) == pytest.approx(1.0, abs=1e-9)
    assert resid[0, others].abs().max() < 1e-9
    assert float(resid[-1, at]) == pytest.approx(1.0, abs=1e-9)
    assert resid[-1, [p for p in range(n) if p != at]].abs().max() < 1e-9
    if not built.causal:
        assert resid[1:-1, :changed].abs().max() > 1e-4
        return
    assert resid[:, :changed].abs().max() < 1e-9
    for site in ("attn", "mlp"):
        assert ap.patch_map(built.model, [example], site, direction=direction).shares[0, :, :changed].abs().max() \
            < 1e-9, site
    for site in HEAD_SITES:
        shares = ap.patch_map(built.model, [example], site, direction=direction, by_position=True,
                              rows_per_forward=64).shares[0]
        assert shares[..., :changed].abs().max() < within(site), site


def test_several_examples_each_kept_and_their_spread():
    """Three examples in one map: each example's row is the map of that example alone and matches the hooks; the
    spread's mean is the mean over examples, its interval contains it, its std is the examples'; with one example
    the interval and std are NaN."""
    built = family("gpt2")
    examples = []
    for seed in (0, 2, 3):
        prompts = induction_prompts(built.pool, 12, seed=seed, bos=0)
        examples.append(ap.Example(list(prompts.clean), list(prompts.corrupted), prompts.answer, prompts.foil))
    n = len(examples[0].clean)
    result = ap.patch_map(built.model, examples, "v", metric="probability")
    assert result.shares.shape == result.values.shape == (3, built.ref.layers, built.ref.heads)
    assert result.clean.shape == result.corrupted.shape == (3,) and len(result.foils) == 3
    for row, example in enumerate(examples):
        alone = ap.patch_map(built.model, [example], "v", metric="probability")
        torch.testing.assert_close(result.values[row], alone.values[0], atol=1e-12, rtol=0)
        torch.testing.assert_close(result.shares[row], alone.shares[0], atol=1e-12, rtol=0)
        assert_matches(result, reference(built.ref, example, "v", "denoising", "probability",
                                         cells(built.ref, "v", n, False)), TIGHT, row)
    spread = result.share_spread
    assert spread.examples == 3
    torch.testing.assert_close(spread.mean, result.shares.mean(0))
    torch.testing.assert_close(spread.std, result.shares.std(0))
    assert bool((spread.low <= spread.mean + 1e-12).all()) and bool((spread.mean <= spread.high + 1e-12).all())
    assert bool((spread.low >= result.shares.min(0).values - 1e-12).all())  # a mean of resampled examples
    assert bool((spread.high <= result.shares.max(0).values + 1e-12).all())
    assert float((spread.high - spread.low).max()) > 0
    torch.testing.assert_close(result.value_spread.mean, result.values.mean(0))
    one = ap.patch_map(built.model, examples[:1], "v", metric="probability").share_spread
    assert one.examples == 1
    torch.testing.assert_close(one.mean, result.shares[0])
    assert bool(one.low.isnan().all() and one.high.isnan().all() and one.std.isnan().all())


def test_spread_is_a_seeded_bootstrap_of_the_mean():
    values = torch.randn(6, 2, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    values[:, 0, 0] = 0.25  # no spread at all: the interval is the point
    first, again = ap.spread(values, seed=5), ap.spread(values, seed=5)
    torch.testing.assert_close(first.low, again.low)
    torch.testing.assert_close(first.mean, values.mean(0))
    assert bool((first.low <= first.mean).all() and (first.mean <= first.high).all())
    assert float(first.low[0, 0]) == float(first.high[0, 0]) == pytest.approx(0.25)
    # the bootstrap by hand: means of examples drawn with replacement, their 2.5 % and 97.5 % quantiles
    picks = torch.randint(6, (2000, 6), generator=torch.Generator().manual_seed(5))
    means = values[picks].mean(1)
    torch.testing.assert_close(first.low, torch.quantile(means, 0.025, dim=0))
    torch.testing.assert_close(first.high, torch.quantile(means, 0.975, dim=0))


def test_what_a_map_refuses():
    built = family("gpt2")
    example = built.example
    with pytest.raises(ValueError, match="unknown site"):
        ap.patch_map(built.model, [example], "nowhere")
    with pytest.raises(ValueError, match="direction"):
        ap.patch_map(built.model, [example], "resid", direction="sideways")
    with pytest.raises(ValueError, match="metric"):
        ap.patch_map(built.model, [example], "resid", metric="accuracy")
    with pytest.raises(ValueError, match="same"):
        ap.patch_map(built.model, [example, ap.Example(example.clean[:-1], example.corrupted[:-1], 1, 2)], "resid")
    with pytest.raises(ValueError, match="no examples"):
        ap.patch_map(built.model, [], "resid")
