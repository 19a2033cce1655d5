"""Patching from a notebook, on the code the "Does this head matter?" page runs: activation patching at any site,
by layer, head and position (:func:`patch`), path patching from head to head (:func:`paths`), the examples they
read (:func:`induction_examples`, :func:`example`), and what a clean run says directly: direct logit attribution
(:func:`attribute`), the logit lens (:func:`logit_lens`) and composition scores from the weights
(:func:`composition`). ``attnviz.show`` draws each result.

Definitions (where they differ from TransformerLens's ``patching`` utilities, say so here):

- A share is per example: denoising (clean into corrupted) ``(patched - corrupted) / (clean - corrupted)``, noising
  (corrupted into clean) ``(clean - patched) / (clean - corrupted)``; 1 means the patch alone brings back (takes
  away) the whole gap. TransformerLens's ``get_act_patch_*`` return the raw metric; ``PatchMap.values`` is that.
- Attention output and MLP output are the sub-layers' outputs as they join the residual stream (TransformerLens's
  ``attn_out`` and ``mlp_out``); a head's output is its weighted values before the output projection (``z``); keys
  and queries are patched after RoPE (the same result as before it, position for position).
- Key and value patches under grouped-query attention act on the K/V head, which several query heads read.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path

import torch

from attnviz.interventions import activation_patching as ap
from attnviz.interventions import patching as presets
from attnviz.interventions import path_patching as pp


@functools.lru_cache(maxsize=2)
def _loaded(folder: str):
    from attnviz.interventions.edits import editable_lm

    return editable_lm(folder)


@contextlib.contextmanager
def _editable(model, tokenizer=None) -> Iterator[tuple[torch.nn.Module, object]]:
    """``(model, tokenizer)`` with attnviz's attention for the block: loaded from a bundled model's name or a
    checkpoint folder (a causal LM, once per process), or a model in memory switched for the block and set back."""
    if isinstance(model, str | Path):
        from attnviz.api.runs import _folder_named

        folder, _ = _folder_named(model)
        loaded, own_tokenizer = _loaded(str(folder))
        yield loaded, tokenizer or own_tokenizer
        return
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a bundled model's name, a checkpoint folder or a loaded transformers model, "
                        f"not {type(model).__name__}")
    from attnviz.api.runs import _edits_reach

    with _edits_reach(model):
        yield model, tokenizer


def _bar(progress: bool, label: str):
    if not progress:
        return None, None
    from attnviz.api.run_control import tqdm

    bar = tqdm(total=1000, desc=label, leave=False)

    def update(share: float, _what: str) -> None:
        bar.n = int(share * 1000)
        bar.refresh()

    return bar, update


def induction_examples(model_or_tokenizer, count: int = 8, *, period: int = 30, seed: int = 0,
                       change: str = "copied", tokenizer=None) -> list[ap.Example]:
    """``count`` induction examples (seeds ``seed`` to ``seed + count - 1``): random ordinary tokens typed, then their
    first half again (after the BOS token when the tokenizer has one); the answer is the token that followed the last
    typed one in the first copy. ``change="copied"`` corrupts that token (the foil: its replacement), ``"previous"``
    the token before it (telling an induction head's keys' path; the foil: the corrupted run's top other token)."""
    from attnviz.core.circuits import ordinary_token_ids

    if tokenizer is None:
        if isinstance(model_or_tokenizer, str | Path):
            tokenizer = _loaded(str(_folder(model_or_tokenizer)))[1]
        else:
            tokenizer = model_or_tokenizer
    pool = ordinary_token_ids(tokenizer)
    return ap.examples_of([presets.induction_prompts(pool, period, seed=seed + k, bos=tokenizer.bos_token_id,
                                                     change=change) for k in range(count)])


def _folder(model) -> Path:
    from attnviz.api.runs import _folder_named

    return _folder_named(model)[0]


def example(tokenizer, clean: str, corrupted: str, answer: str, foil: str = "", *, bos: bool = True) -> ap.Example:
    """One example from text: both prompts as the tokenizer reads them (after its BOS token when ``bos`` and it has
    one; the same number of tokens), the answer and the foil as their first tokens (an empty foil: the corrupted
    run's most likely other token). A ValueError says what is wrong with them."""
    made = presets.own_prompts(tokenizer, clean, corrupted, answer, foil, bos)
    if isinstance(made, str):
        raise ValueError(made)
    return ap.examples_of(made)[0]


def patch(model, examples, site: str = "resid", *, tokenizer=None, direction: str = "denoising",
          metric: str = "logit difference", by_position: bool = False, progress: bool = True) -> ap.PatchMap:
    """Patch every cell of ``site`` ("resid", "attn", "mlp", "head", "q", "k", "v" or "pattern") on each example,
    in ``direction`` ("denoising" or "noising"), measured by ``metric`` ("logit difference", "probability" or
    "loss") at each example's position (the last by default). ``model``: a bundled model's name, a checkpoint folder
    or a causal LM in memory (switched to attnviz's attention while it runs). Returns a
    :class:`~attnviz.interventions.activation_patching.PatchMap`: ``values`` and ``shares`` per example,
    ``share_spread`` their mean with a 95 % bootstrap interval."""
    bar, update = _bar(progress, f"patching {site}")
    try:
        with _editable(model, tokenizer) as (loaded, _):
            return ap.patch_map(loaded, examples, site, direction=direction, metric=metric, by_position=by_position,
                                progress=update)
    finally:
        if bar is not None:
            bar.close()


def paths(model, examples, receiver: tuple[int, int], via: str = "k", *, mlps="frozen", tokenizer=None,
          direction: str = "denoising", metric: str = "logit difference", progress: bool = True) -> pp.PathMap:
    """Path patching: every head before ``receiver`` (layer, head) as a sender into its queries, keys or values
    (``via``), with the MLPs between them held (``mlps="frozen"``: the direct path), free (``"free"``), or only the
    layers in a tuple free. See :mod:`attnviz.interventions.path_patching` for the two steps."""
    bar, update = _bar(progress, f"paths into L{receiver[0]} H{receiver[1]}")
    try:
        with _editable(model, tokenizer) as (loaded, _):
            return pp.path_patching(loaded, examples, receiver, via, mlps=mlps, direction=direction, metric=metric,
                                    progress=update)
    finally:
        if bar is not None:
            bar.close()


def _ids(example_or_ids) -> tuple[list[int], int | None, int | None]:
    if isinstance(example_or_ids, ap.Example):
        return list(example_or_ids.clean), example_or_ids.answer, example_or_ids.foil
    return list(example_or_ids), None, None


def _read(reading, model, example_or_ids, answer: int | None, foil: int | None, tokenizer):
    """``reading(model, ids, answer, foil)`` on a prompt (an Example's clean prompt, or ids), the answer and foil
    given or the Example's (its foil None: the corrupted run's most likely token other than the answer)."""
    ids, given_answer, given_foil = _ids(example_or_ids)
    answer, foil = answer if answer is not None else given_answer, foil if foil is not None else given_foil
    with _editable(model, tokenizer) as (loaded, _):
        if foil is None and answer is not None and isinstance(example_or_ids, ap.Example):
            foil = ap.ends(loaded, example_or_ids, "logit difference").foil
        if answer is None or foil is None:
            raise ValueError("give the answer and the foil (token ids), or an Example")
        return reading(loaded, ids, answer, foil)


def attribute(model, example_or_ids, answer: int | None = None, foil: int | None = None, *, tokenizer=None):
    """Direct logit attribution of logit(answer) - logit(foil) at every position of a prompt (an
    :class:`~attnviz.interventions.activation_patching.Example`'s clean prompt, its answer and foil, or token ids
    with ``answer`` and ``foil``): every head, MLP, the embeddings and the biases, the final norm's scale frozen at
    its value on the prompt (in a post-norm model such as BERT every norm's scale and the output head's activation
    gate, each frozen). The parts sum to the model's own difference (else refused, the reason in words). Returns an
    :class:`~attnviz.interventions.logit_attribution.Attribution`."""
    from attnviz.interventions import logit_attribution as dla

    return _read(dla.direct_logit_attribution, model, example_or_ids, answer, foil, tokenizer)


def logit_lens(model, example_or_ids, answer: int | None = None, foil: int | None = None, *, tokenizer=None):
    """The logit lens: the stream at each layer boundary read through the final norm and the unembedding (a masked
    LM: through its whole MLM head), at every position: logit(answer) - logit(foil), the answer's probability, its
    rank and the top token. Returns a :class:`~attnviz.interventions.logit_attribution.Lens`."""
    from attnviz.interventions import logit_attribution as dla

    return _read(dla.logit_lens, model, example_or_ids, answer, foil, tokenizer)


def composition(model, kind: str = "K", *, tokenizer=None):
    """Q-, K- or V-composition between every pair of heads from the weights alone (Elhage et al. 2021, as
    TransformerLens's ``all_composition_scores`` defines it), with the score random matrices of the same shapes get.
    Returns a :class:`~attnviz.interventions.composition.CompositionScores`."""
    from attnviz.interventions import composition as comp

    with _editable(model, tokenizer) as (loaded, _):
        return comp.composition_scores(loaded, kind)
