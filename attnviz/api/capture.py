"""Capture from a notebook: run a model on a text and keep what every attention call received, as the pages do.

The model can be a ``transformers`` model already in memory (with its tokenizer), a checkpoint folder, or a bundled
model's name ("all-MiniLM-L6-v2", "tiny GPT", or any start of one that names it alone, in any case)::

    import attnviz
    captured = attnviz.capture(model, tokenizer, "The cat sat on the mat.")
    captured                      # Captured(gpt2 (in memory): 8 tokens, 12 layers x 12 heads, replay passed ...)
    captured.tokens               # ['The', '␣cat', '␣sat', ...]: the tokens as the pages show them
    captured.weights(3)           # layer 3: [heads, query, key], each row sums to 1
    captured.replay               # did attnviz's recomputation reproduce the model's own attention outputs?

Underneath is the app's own capture (:func:`attnviz.models.capture.capture`): the model runs on its fast path while
attnviz records the queries, keys, values, masks and score terms of every call, and replays the weights from them
on demand. :func:`bundle_of` gives the :class:`~attnviz.models.loading.ModelBundle` the rest of attnviz works on.

A model object is observed through its attention implementation: for the time of a :func:`capture` it runs on
attnviz's (``attn_implementation="attnviz"``: the same SDPA kernel, recorded) in eval mode, and both are set back
afterwards; :func:`bundle_of` switches them for good (see there). Only model types attnviz has a record of
(:data:`attnviz.models.architectures.ARCHITECTURES`) and classes of ``transformers`` itself are read: no code that
came with a checkpoint ever runs (``trust_remote_code`` stays off).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.corpus.command import chosen_model
from attnviz.models import architectures, eager
from attnviz.models.attention_hook import ATTENTION_NAME
from attnviz.models.capture import capture as capture_bundle
from attnviz.models.loading import ModelBundle, bundle_of_loaded_model, load_model_dir
from attnviz.models.record import AttentionRecord, Capture
from attnviz.models.replay_check import replay_difference
from attnviz.models.shipped import bundled_models
from attnviz.pagelogic.explore_heads.setup_notes import replay_waits

# An in-memory model has no folder: its bundle names one under this, which exists nowhere (anything that reloads a
# model from its folder, such as a scan's Ray workers, needs the model saved: model.save_pretrained(folder)).
IN_MEMORY_FOLDER = Path("<in memory>")

_BUNDLED: dict[str, ModelBundle] = {}  # bundled models loaded in this process, by name: each is loaded once


def _text_types() -> str:
    """The text model types attnviz reads, for a refusal."""
    return ", ".join(sorted(t for t in architectures.ARCHITECTURES if not architectures.reads_images(t)))


def _is_model_object(model) -> bool:
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel)


def _check_model_object(model, tokenizer) -> str:
    """Refuse, in words, what :func:`capture` cannot read from a model object; its model type otherwise."""
    if not _is_model_object(model):
        raise TypeError(f"model must be a transformers model (a PreTrainedModel), a checkpoint folder, a ModelBundle "
                        f"or a bundled model's name ({', '.join(map(repr, bundled_models()))}); got "
                        f"{type(model).__name__}")
    module = type(model).__module__
    if module.split(".")[0] != "transformers":
        raise ValueError(f"{type(model).__name__} is defined in {module}, not in transformers: attnviz runs only "
                         "transformers' own model classes, never code that came with a checkpoint or was written "
                         "around one (trust_remote_code stays off)")
    model_type = str(getattr(model.config, "model_type", "") or "")
    if model_type not in architectures.ARCHITECTURES:
        raise ValueError(f"attnviz has no record of model type {model_type!r} "
                         f"({type(model).__name__}), so it cannot say how to observe its attention; it reads "
                         f"{_text_types()} (attnviz.models.architectures)")
    if architectures.reads_images(model_type):
        raise ValueError(f"{model_type} is a vision transformer: it reads images, and capture() reads text (the "
                         "app's Explore heads page shows vision models on an image)")
    if tokenizer is None:
        raise TypeError(f"a model object needs its tokenizer: capture(model, tokenizer, text) (tokenizer=None was "
                        f"given for a {model_type} model)")
    _check_tokenizer(tokenizer)
    return model_type


def _check_tokenizer(tokenizer) -> None:
    if not callable(tokenizer) or not hasattr(tokenizer, "convert_ids_to_tokens"):
        raise TypeError(f"tokenizer must be a transformers tokenizer (callable on a text, with "
                        f"convert_ids_to_tokens); got {type(tokenizer).__name__} (a sentence pair's second text "
                        "goes in text_pair=...)")


@contextlib.contextmanager
def _observed(model: torch.nn.Module, path: str, *, restore: bool = True):
    """While the block runs, ``model`` is in eval mode on the attention implementation its capture path reads:
    attnviz's recorded one ("interface"), or transformers' eager one, which returns the weights the hooks and
    weights paths read. With ``restore`` both are set back when the block ends."""
    wanted = ATTENTION_NAME if path == "interface" else "eager"
    previous = model.config._attn_implementation
    training = model.training
    switched = previous != wanted
    if switched:
        model.set_attn_implementation(wanted)
        if model.config._attn_implementation != wanted:
            raise ValueError(f"{type(model).__name__} does not let its attention implementation be switched to "
                             f"{wanted!r}, which attnviz reads it through: load it with "
                             f"attn_implementation={wanted!r} after `import attnviz.models.attention_hook`")
    model.eval()
    try:
        yield
    finally:
        if restore:
            if switched and previous is not None:
                model.set_attn_implementation(previous)
            model.train(training)


def _default_name(model: torch.nn.Module) -> str:
    """What an in-memory model is called: where it was loaded from, if anywhere, else its class."""
    source = str(getattr(model.config, "name_or_path", "") or "")
    return f"{source or type(model).__name__} (in memory)"


def _describe_model_object(model, tokenizer, model_type: str, path: str, name: str | None) -> ModelBundle:
    """The bundle of a model object, already observed on ``path`` (see :func:`_observed`): checked to return its
    weights where the path reads the eager ones, and tried on a test sentence."""
    if path != "interface":
        config = model.config
        eager.check_weights_come_back(model, model_type, bool(getattr(config, "is_encoder_decoder", False)),
                                      int(getattr(config, "vocab_size", 0) or 0))
    folder = IN_MEMORY_FOLDER / f"{type(model).__name__}-{id(model):x}"
    return bundle_of_loaded_model(model, tokenizer, name=name or _default_name(model), folder=folder,
                                  capture_path=path)


def _bundle_from_disk(source: str | Path) -> ModelBundle:
    """A checkpoint folder, or a bundled model by its name (or the start of one), loaded as the app loads it;
    bundled models once per process."""
    if isinstance(source, Path):
        if not source.is_dir():
            raise ValueError(f"{str(source)!r} is not a folder: give a checkpoint folder, or a bundled model's name "
                             f"({', '.join(map(repr, bundled_models()))})")
        folder, bundled_name = source, None
    else:
        try:
            folder, bundled_name = chosen_model(source, bundled_models())
        except CheckpointRefused:
            raise ValueError(f"{source!r} is neither a folder nor a bundled model's name; the bundled models are "
                             f"{', '.join(map(repr, bundled_models()))} (a start that names one alone will do, in "
                             "any case)") from None
    if bundled_name is None:
        return load_model_dir(folder)
    if bundled_name not in _BUNDLED:
        _BUNDLED[bundled_name] = load_model_dir(folder, name=bundled_name)
    return _BUNDLED[bundled_name]


def bundle_of(model, tokenizer=None, *, name: str | None = None) -> ModelBundle:
    """The :class:`~attnviz.models.loading.ModelBundle` attnviz works on, resolved as :func:`capture` resolves
    ``model``: a ``transformers`` model object with its ``tokenizer``, a checkpoint folder (``str`` or ``Path``,
    loaded and checked as the app loads an upload), a bundled model's name or the start of one ("tiny GPT",
    "all-MiniLM-L6-v2", any case; each is loaded once per process), or a bundle (returned as it is). ``tokenizer``
    given with a folder, name or bundle replaces the checkpoint's own. ``name``: what the bundle is called
    (default: the bundled name, the folder's name, or for a model object where it came from and "(in memory)").

    A model object is never saved to disk: the bundle holds the object itself. Its type must be one attnviz has a
    record of and its class one of ``transformers``'s own (refused with the reason otherwise). To be observed
    from here on, by anything given the bundle (:func:`attnviz.models.capture.capture`, head edits, corpus runs),
    the model is switched **for good** to eval mode and to attnviz's attention implementation
    (``attn_implementation="attnviz"``: the same SDPA kernel, recorded while attnviz captures; models whose
    attention is in their own code to ``"eager"``). Its outputs do not change, but ``output_attentions=True`` then
    returns no weights: ``model.set_attn_implementation("sdpa")`` sets it back. (:func:`capture` switches only
    for the time it runs.) The bundle's ``folder`` is a name under :data:`IN_MEMORY_FOLDER` that exists nowhere:
    what reloads a model from its folder (a scan's Ray workers, one model replica each) needs it saved with
    ``model.save_pretrained(folder)`` (and the tokenizer beside it), then given as that folder."""
    if isinstance(model, (ModelBundle, str, Path)):
        if tokenizer is not None:
            _check_tokenizer(tokenizer)
        bundle = model if isinstance(model, ModelBundle) else _bundle_from_disk(model)
        changes = {**({} if name is None else {"name": name}),
                   **({} if tokenizer is None else {"tokenizer": tokenizer, "tokenizer_note": None})}
        return dataclasses.replace(bundle, **changes) if changes else bundle
    model_type = _check_model_object(model, tokenizer)
    path = architectures.capture_path_of(model, model_type)
    with _observed(model, path, restore=False):
        return _describe_model_object(model, tokenizer, model_type, path, name)


@dataclass(frozen=True)
class Replay:
    """The replay check of a capture, as Explore heads shows it: attnviz recomputed every head's weights from the
    model's own queries and keys, multiplied them by its values, and compared the result with the attention output
    of the model's own kernel (run again on the same tensors), layer by layer.

    ``checked``: False where there is nothing to replay (models whose attention code gives attnviz only its eager
    weights). ``passed``: every output within what rounding in the model's ``dtype`` allows it (None when not
    checked). ``max_difference``: the largest |attnviz's output - the model's| over every layer, head, query and
    value dimension (NaN where an output is not finite, or nothing was checked). ``share_of_rounding``: the
    output nearest its bound, its difference over the bound (at most 1 to pass)."""

    checked: bool
    passed: bool | None
    max_difference: float
    share_of_rounding: float
    dtype: str

    def __str__(self) -> str:
        if not self.checked:
            return "replay not applicable (this model's attention gives attnviz only its eager weights)"
        if not math.isfinite(self.max_difference):
            return "replay not finite (NaN or infinity in a layer's attention output)"
        if self.passed and self.max_difference == 0:
            return "replay passed (exact)"
        verdict = "passed" if self.passed else "FAILED"
        within = "within" if self.passed else "beyond"
        return f"replay {verdict} (max difference {self.max_difference:.1e}, {within} {self.dtype} rounding)"


def replay_of(records: list[AttentionRecord], model: torch.nn.Module | None = None) -> Replay:
    """The replay check over ``records`` (the capture's attention kinds) as one :class:`Replay`: the worst of
    them (:func:`attnviz.models.replay_check.replay_difference`). ``model``: the loaded model whose kernels run."""
    replayable = [record for record in records if record.replayable]
    if not replayable:
        return Replay(False, None, math.nan, math.nan, "")
    differences = [replay_difference(record, model=model) for record in replayable]
    dtype = str(differences[0].dtype).removeprefix("torch.")
    if not all(math.isfinite(d) for d in differences):
        return Replay(True, False, math.nan, math.nan, dtype)
    worst = max(differences, key=lambda d: d.share)
    return Replay(True, all(d.passed for d in differences), max(float(d) for d in differences), worst.share, dtype)


class Captured:
    """One text captured on one model: its tokens, every head's attention weights, and the replay check.

    - ``tokens``: the tokens as the pages show them (``"␣the"`` for GPT-2's ``"Ġthe"``, ``"↵"`` for a newline:
      :mod:`attnviz.core.tokens_display`); ``raw_tokens`` and ``token_ids`` are the tokenizer's own.
    - ``weights(layer)``: one layer's weights ``[heads, query, key]`` (fp32, each query's row sums to 1 over the
      keys its mask lets it see); ``weights()``: every layer's, ``[layers, heads, query, key]`` (texts up to
      :func:`attnviz.models.record.dense_token_limit` tokens).
    - ``n_layers``, ``n_heads``, ``n_tokens``, ``model_name``; ``replay``: the :class:`Replay` check.
    - ``kind``: the attention shown by default, "self" (an encoder's or a decoder's), or "encoder" for an
      encoder-decoder, whose "decoder" and "cross" attentions are in ``kinds`` (each method takes ``kind=``).
    - ``capture`` and ``bundle``: attnviz's own :class:`~attnviz.models.record.Capture` and
      :class:`~attnviz.models.loading.ModelBundle`, for the functions of :mod:`attnviz.pagelogic`.

    Layers and heads are numbered from 0, as in the app.
    """

    def __init__(self, result: Capture, bundle: ModelBundle, replay: Replay | None = None):
        self.capture = result
        self.bundle = bundle
        self.kind = next((k for k in ("self", "encoder") if k in result.records), next(iter(result.records)))
        self._replay = replay

    @property
    def kinds(self) -> list[str]:
        """The attention kinds captured: ["self"], or an encoder-decoder's ["encoder", "decoder", "cross"]."""
        return list(self.capture.records)

    def record(self, kind: str | None = None) -> AttentionRecord:
        """The :class:`~attnviz.models.record.AttentionRecord` of attention ``kind`` (default :attr:`kind`)."""
        kind = self.kind if kind is None else kind
        if kind not in self.capture.records:
            raise ValueError(f"no {kind!r} attention in this capture: it has {', '.join(map(repr, self.kinds))}")
        return self.capture.records[kind]

    @property
    def model_name(self) -> str:
        """The model's name: the bundled name, the folder's, or where a model object came from "(in memory)"."""
        return self.capture.model_name

    @property
    def text(self) -> str:
        """The text captured (all of it, also where the model read only its start)."""
        return self.capture.text

    @property
    def tokens(self) -> list[str]:
        """The (query) tokens of :attr:`kind` as the pages show them."""
        return list(self.record().query_display)

    @property
    def raw_tokens(self) -> list[str]:
        """The tokenizer's own pieces of the (encoder's) input (``"Ġthe"``)."""
        return list(self.capture.tokens)

    @property
    def token_ids(self) -> list[int] | None:
        """The tokenizer's ids of the (encoder's) input."""
        return self.capture.token_ids

    @property
    def n_tokens(self) -> int:
        """How many (query) tokens the model read."""
        return self.record().n_q

    @property
    def n_layers(self) -> int:
        """Layers of :attr:`kind`'s attention."""
        return self.record().n_layers

    @property
    def n_heads(self) -> int:
        """Query heads per layer (grouped-query models share fewer K/V heads among them)."""
        return self.record().n_heads

    def check_layer(self, layer: int, kind: str | None = None) -> int:
        """``layer`` if this capture has it, else a ValueError naming the layers there are."""
        count = self.record(kind).n_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < count:
            raise ValueError(f"layer {layer!r} does not exist: this model has layers 0 to {count - 1}")
        return layer

    def check_head(self, head: int, kind: str | None = None) -> int:
        """``head`` if each layer has it, else a ValueError naming the heads there are."""
        count = self.record(kind).n_heads
        if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < count:
            raise ValueError(f"head {head!r} does not exist: each layer has heads 0 to {count - 1}")
        return head

    def weights(self, layer: int | None = None, *, kind: str | None = None) -> torch.Tensor:
        """Attention weights, fp32 on the CPU, recomputed by attnviz from the model's own queries and keys (or
        transformers' eager weights where that is all a model gives): ``layer``'s ``[heads, query, key]``, or with no
        layer every layer's ``[layers, heads, query, key]``. Row ``i`` of a head is how query token ``i`` spreads
        its attention over the keys (masked keys get 0)."""
        record = self.record(kind)
        if layer is None:
            record.check_dense()
            return record.every_layer_weights()  # [layers, heads, n_q, n_k]
        return record.layer_weights(self.check_layer(layer, kind))  # [heads, n_q, n_k]

    @property
    def replay(self) -> Replay:
        """The replay check (:class:`Replay`), run on first use where :func:`capture` did not run it."""
        if self._replay is None:
            self._replay = replay_of(list(self.capture.records.values()), self.bundle.model)
        return self._replay

    def __repr__(self) -> str:
        cut = f" (cut from {self.capture.length_of_text})" if self.capture.truncated else ""
        replay = str(self._replay) if self._replay is not None else "replay not run yet (read .replay to run it)"
        problems = f"; not finite: {', '.join(self.capture.nonfinite)}" if self.capture.nonfinite else ""
        return (f"Captured({self.model_name}: {self.n_tokens} tokens{cut}, {self.n_layers} layers x "
                f"{self.n_heads} heads, {replay}{problems})")


def _checked_text(text) -> str:
    if text is None:
        raise TypeError("capture() needs text: capture(model, tokenizer, text=\"The cat sat on the mat.\")")
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    if not text.strip():
        raise ValueError("text is empty: give capture() a sentence to run the model on")
    return text


def capture(model, tokenizer=None, text: str | None = None, *, text_pair: str | None = None,
            max_tokens: int | None = None, name: str | None = None, check_replay: bool | None = None) -> Captured:
    """Run ``model`` on ``text`` and capture every attention call: a :class:`Captured`.

    ``model``: a ``transformers`` model object (any type attnviz has a record of: BERT-likes, GPT-2, Llama, T5...;
    see :data:`attnviz.models.architectures.ARCHITECTURES`) with its ``tokenizer``; a checkpoint folder; a bundled
    model's name or a start that names one alone ("tiny GPT", "all-MiniLM-L6-v2", any case); or a bundle from
    :func:`bundle_of`. For the last three the tokenizer is the checkpoint's own, so ``capture("tiny GPT", "Some
    text")`` reads the second argument as the text. A model object is run in eval mode on attnviz's recorded
    attention implementation and set back afterwards (it is not saved anywhere, and its weights are not copied).

    ``text_pair``: a second sentence (BERT's A/B pairs), or an encoder-decoder's decoder input (default: the text).
    ``max_tokens``: read at most this many tokens (default: as many as the model reads; models whose attention is
    read from eager weights are capped so every layer's weights fit at once). ``name``: what the capture calls the
    model. ``check_replay``: run the replay check now (True), on first reading of ``.replay`` (False), or now
    unless the input is as large as the app makes it wait for a button (None, the default).

    Raises TypeError for a missing or wrong model, tokenizer or text, ValueError for an empty text or a model
    attnviz does not read (with the reason), and :class:`~attnviz.checkpoints.safety.CheckpointRefused` (a
    ValueError) for a checkpoint that fails attnviz's checks."""
    if text is None and isinstance(tokenizer, str) and not _is_model_object(model):
        tokenizer, text = None, tokenizer  # capture("tiny GPT", "Some text"): the checkpoint has its tokenizer
    text = _checked_text(text)
    if _is_model_object(model) or not isinstance(model, (str, Path, ModelBundle)):
        model_type = _check_model_object(model, tokenizer)
        path = architectures.capture_path_of(model, model_type)
        with _observed(model, path):
            bundle = _describe_model_object(model, tokenizer, model_type, path, name)
            return _captured(bundle, text, text_pair, max_tokens, check_replay)  # observed: set back only here
    bundle = bundle_of(model, tokenizer, name=name)
    return _captured(bundle, text, text_pair, max_tokens, check_replay)


def _captured(bundle: ModelBundle, text: str, text_pair: str | None, max_tokens: int | None,
              check_replay: bool | None) -> Captured:
    """The capture of ``text`` on ``bundle`` (observed as its path needs), with its replay check where asked."""
    if bundle.modality != "text":
        raise ValueError(f"{bundle.name} is a vision transformer: it reads images, and capture() reads text")
    # a bundle's model may have been switched to another attention implementation since (a notebook's own)
    with _observed(bundle.model, bundle.capture_path):
        result = capture_bundle(bundle, text, text_pair, max_tokens=max_tokens)
    records = list(result.records.values())
    run_now = check_replay if check_replay is not None else not any(replay_waits(r) for r in records if r.replayable)
    return Captured(result, bundle, replay_of(records, bundle.model) if run_now else None)
