"""Find and load checkpoints: the bundled default BERT, uploads, and folders on the server's disk.

Every model is loaded with ``attn_implementation="attnviz"`` (its fast path, recorded: see
:mod:`attnviz.models.attention_hook`), in the dtype its weights are stored in unless fp32 is asked for, from
local files only, from safetensors only, and with ``trust_remote_code=False``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnviz.checkpoints import preflight
from attnviz.checkpoints.image_processors import load_image_processor
from attnviz.checkpoints.safety import CheckpointRefused, first_line
from attnviz.checkpoints.uploads import link_rule_for
from attnviz.models import architectures, eager
from attnviz.models.attention_hook import ATTENTION_NAME
from attnviz.models.text_tokenizers import (  # noqa: F401 - FallbackTokenizer: used from here by pages and tests
    TOKENIZER_FILES,
    FallbackTokenizer,
    load_tokenizer,
    tokenizer_of,
)
from attnviz.models.trials import check_it_runs

# transformers' from_pretrained is not thread-safe: it builds the model under process-wide switches (empty
# weights on the meta device, then ties and fills them), so two loads at once, in two sessions or in a session
# and the server's warm-up, can hand one of them a model with a weight left on the meta device (seen: the tiny
# GPT's tied lm_head, which then gave logits of 1e38). Every build of a model holds this lock; everything that
# can refuse a checkpoint cheaply (attnviz.checkpoints.preflight) runs before it is taken.
LOADING = threading.RLock()


@contextlib.contextmanager
def loading_lock(progress=None):
    """Hold :data:`LOADING`, saying every second how long another load has kept it (``progress(text)``)."""
    waited = 0
    while not LOADING.acquire(timeout=1.0):
        waited += 1
        if progress:
            progress(f"Waiting for another model to finish loading ({waited} s)…")
    try:
        yield
    finally:
        LOADING.release()

MAX_MISSING_WEIGHT_SHARE = 0.2  # more weight tensors missing than this: the weights are not for this architecture
MAX_PARAMETERS = 3_000_000_000  # an interactive page on a laptop CPU: beyond this, refuse rather than swap


@dataclass
class ModelBundle:
    """A loaded model with what the pages need to know about it."""

    name: str
    folder: Path
    model: torch.nn.Module
    tokenizer: object  # a transformers tokenizer, or a FallbackTokenizer
    tokenizer_note: str | None  # set when the tokenizer is a fallback: shown in the page
    model_type: str
    architecture: str  # "encoder", "decoder" or "encoder-decoder"
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    max_positions: int
    n_parameters: int
    dtype: str = "float32"  # the weights' dtype as loaded
    placement: str = "CPU"  # where the weights are: "CPU", "GPU (name)", or with "disk offload"
    nonfinite: list[str] = field(default_factory=list)  # weights holding NaN or infinity (loaded, and warned about)
    nonfinite_outputs: str | None = None  # "its outputs on the test sentence ...": NaN or infinite at load
    notes: list[str] = field(default_factory=list)  # files of the checkpoint that were left out, and why
    # How attention is observed: "interface" (recorded from transformers' attention interface, replayed), "hooks"
    # (the model's own attention code, read by hooks and replayed) or "weights" (transformers' eager weights only)
    capture_path: str = "interface"
    modality: str = "text"  # or "image": a vision transformer (attnviz.core.vision), which reads images, not text
    image_processor: object = None  # vision models: the checkpoint's own processor, or a marked stand-in

    @property
    def replayable(self) -> bool:
        """Whether attnviz has the queries and keys (Q.K view, what-if, scaling and position experiments)."""
        return self.capture_path != "weights"

    @property
    def capture_note(self) -> str | None:
        """What the page says about a model that does not use transformers' attention interface."""
        return architectures.capture_note(self.model_type, self.capture_path)

    @property
    def uses_fallback_tokenizer(self) -> bool:
        return isinstance(self.tokenizer, FallbackTokenizer)

    def describe(self) -> str:
        kv = f", {self.n_kv_heads} K/V heads" if self.n_kv_heads != self.n_heads else ""
        return (
            f"{self.model_type} {self.architecture}: {self.n_layers} layers x {self.n_heads} heads{kv}, "
            f"d_model {self.d_model}, {self.n_parameters / 1e6:.1f}M parameters ({self.dtype}, {self.placement}), "
            f"up to {self.max_positions:,} tokens"
        )


def _architecture_of(config) -> str:
    """"encoder", "decoder" or "encoder-decoder" (:func:`attnviz.models.architectures.architecture_of`)."""
    return architectures.architecture_of(config.model_type,
                                   is_encoder_decoder=bool(getattr(config, "is_encoder_decoder", False)),
                                   is_decoder=bool(getattr(config, "is_decoder", False)))


def _config_of_folder(folder: str | Path) -> dict | None:
    """A folder's config.json, read with the upload checks and nothing else (None if it cannot be read)."""
    try:
        checked = preflight.regular_file(Path(folder), preflight.CONFIG, link_rule_for(Path(folder)))
        config = preflight.read_json(checked, preflight.CONFIG_LIMITS[preflight.CONFIG]) if checked else None
    except (CheckpointRefused, OSError):
        return None
    return config if isinstance(config, dict) else None


def architecture_of_folder(folder: str | Path) -> str | None:
    """"encoder", "decoder" or "encoder-decoder" from a folder's config.json, without loading the model (None if
    it cannot be read)."""
    config = _config_of_folder(folder)
    return architecture_of_config(config) if config is not None else None


def folder_reads_images(folder: str | Path) -> bool:
    """Whether the model in ``folder`` reads images (a vision transformer), from its config.json alone."""
    config = _config_of_folder(folder)
    return config is not None and architectures.reads_images(str(config.get("model_type", "")))


def architecture_of_config(config: dict) -> str:
    """"encoder", "decoder" or "encoder-decoder" from a config.json's content."""
    return architectures.architecture_of(str(config.get("model_type", "")),
                                   is_encoder_decoder=bool(config.get("is_encoder_decoder")),
                                   is_decoder=bool(config.get("is_decoder")))


DTYPES = {"stored": "auto", "fp32": torch.float32}  # what the Checkpoints page offers
MEMORY_SHARE = 0.6  # weights larger than this share of the free memory are offloaded (accelerate), not swapped


def weights_bytes(folder: Path) -> int:
    """The bytes of the weights transformers will read in ``folder`` (checked: :mod:`attnviz.checkpoints.preflight`)."""
    folder = Path(folder)
    return sum(f.size for f in preflight.resolve_weights(folder, link_rule_for(folder))[0])


def placement(folder: Path, *, max_memory: dict | None = None, offload_folder: str | None = None,
              size: int | None = None) -> dict:
    """Where from_pretrained puts the weights (accelerate's engine, the one transformers uses for models that
    outgrow a device): the GPU when there is one (then the CPU, then the disk); on a CPU-only machine, weights
    that do not fit in MEMORY_SHARE of the free memory are offloaded to disk layer by layer. ``max_memory``
    (e.g. ``{"cpu": "2GB"}``) overrides the budget; ``size``: the weights' bytes, if known."""
    import tempfile

    if max_memory is None and not torch.cuda.is_available():
        import psutil

        free = psutil.virtual_memory().available
        if (weights_bytes(folder) if size is None else size) <= MEMORY_SHARE * free:
            return {}  # fits: plain loading, on the CPU
        max_memory = {"cpu": int(MEMORY_SHARE * free)}
    offload = offload_folder or tempfile.mkdtemp(prefix="attnviz-offload-")
    return {"device_map": "auto", "max_memory": max_memory, "offload_folder": offload}


def _placement_text(model: torch.nn.Module) -> str:
    devices = set(str(device) for device in (getattr(model, "hf_device_map", None) or {}).values())
    if not devices:
        device = next(model.parameters()).device
        return f"GPU: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "CPU"
    names = []
    if any(d.isdigit() or d.startswith("cuda") for d in devices):
        names.append("GPU")
    if "cpu" in devices:
        names.append("CPU")
    if "disk" in devices:
        names.append("disk offload")
    return " + ".join(names)


def parameters_in_files(folder: Path) -> int:
    """How many numbers the weights transformers would read hold, from their headers (no weights are loaded)."""
    folder = Path(folder)
    return preflight.parameters_of(preflight.resolve_weights(folder, link_rule_for(folder))[2])


MAX_REUSE = 24  # a shared-layer model may cost this many times its weights (ALBERT xlarge: 24 calls, 20.7x)


def layer_call_cost(skeleton, config) -> int:
    """The parameters a forward pass goes through, counting each layer call: a model's parameters, and for a
    shared-layer model (ALBERT) its shared groups again for every further call (``num_hidden_layers`` calls
    through ``num_hidden_groups`` groups)."""
    described = sum(p.numel() for p in skeleton.parameters())
    if not architectures.shares_layers(getattr(config, "model_type", "")):
        return described
    shared = sum(p.numel() for name, p in skeleton.named_parameters() if "layer_groups" in name)
    calls = max(1, int(getattr(config, "num_hidden_layers", 1)))
    groups = max(1, int(getattr(config, "num_hidden_groups", 1)))
    return described - shared + -(-calls * shared // groups)  # each call runs one group, a groups'th of them


def _check_layer_calls(skeleton, config, described: int, in_files: int) -> None:
    """A shared-layer model's cost is bounded by its layer calls, not by the weights alone: 47 MB of ALBERT weights
    declared as 256 layers cost 21 times the 12 they came with, at every capture."""
    cost = layer_call_cost(skeleton, config)
    if cost == described:
        return
    if cost > MAX_PARAMETERS or cost > MAX_REUSE * max(in_files, described) + 1_000_000:
        calls = int(getattr(config, "num_hidden_layers", 1))
        raise CheckpointRefused(
            f"config.json runs its shared layers {calls} times: a forward pass costs as much as {cost / 1e6:,.0f}M "
            f"parameters, {cost / max(in_files, 1):,.0f} times the {in_files / 1e6:,.1f}M its weights hold (attnviz "
            f"reads a shared-layer model up to {MAX_REUSE} times its weights, as the largest ALBERT uses them, and up "
            f"to {MAX_PARAMETERS / 1e9:.0f}B parameters' worth)")


def _check_size_before_loading(config, in_files: int, progress=None, builder=None) -> str:
    """Refuse a config that would allocate far more than its weights hold (or than this app can show) before
    transformers builds it: a tiny upload must not make the server allocate a huge random model. The config's
    numbers were bounded already (:func:`attnviz.checkpoints.preflight.check_config_numbers`), so this build of its
    skeleton on the meta device takes well under a second."""
    from transformers import AutoModel

    try:
        with loading_lock(progress), torch.device("meta"):  # shapes only, no memory
            skeleton = (builder or AutoModel).from_config(config, trust_remote_code=False)
    except Exception as problem:  # noqa: BLE001
        raise CheckpointRefused(f"transformers cannot build this architecture: {first_line(problem)}") from None
    described = sum(p.numel() for p in skeleton.parameters())
    buffers = sum(b.numel() for b in skeleton.buffers())
    if described > MAX_PARAMETERS:
        raise CheckpointRefused(
            f"config.json describes a model of {described / 1e9:.1f}B parameters; this app loads up to "
            f"{MAX_PARAMETERS / 1e9:.0f}B on a CPU"
        )
    if described > 1.5 * in_files + 1_000_000:
        raise CheckpointRefused(
            f"config.json describes {described / 1e6:.1f}M parameters but the safetensors hold only "
            f"{in_files / 1e6:.1f}M: the weights do not belong to this config (wrong architecture, or missing shards?)"
        )
    _check_layer_calls(skeleton, config, described, in_files)
    if buffers > max(described, 50_000_000):  # tables a model computes at build time (positions, RoPE caches)
        raise CheckpointRefused(f"config.json asks for {buffers / 1e6:.0f}M numbers of tables computed when the model "
                                f"is built, more than its {described / 1e6:.0f}M parameters")
    _check_inputs(skeleton, config.model_type)
    return architectures.capture_path_of(skeleton, config.model_type)


def _check_inputs(model: torch.nn.Module, model_type: str) -> None:
    """Refuse, naming the type and the reason, a model that reads neither token ids nor (for the vision types)
    images: speech and other inputs this app has no page for."""
    if architectures.reads_images(model_type):
        return
    accepted = set(inspect.signature(model.forward).parameters)
    if "input_ids" not in accepted:
        reads = next((name for name in ("input_features", "input_values", "pixel_values") if name in accepted),
                     "something other than text")
        what = {"input_features": "audio features", "input_values": "raw audio", "pixel_values": "images"}.get(
            reads, reads)
        raise CheckpointRefused(f"{model_type} models read {what}, not text; attnviz reads text models and the "
                                "vision transformers it lists "
                                f"({', '.join(sorted(architectures.TESTED_VISION_TYPES))})")


def _read_checked_config(checked: preflight.CheckedFolder, view: Path, progress=None, builder=None):
    """The config transformers makes of the checked config.json, refused if transformers cannot read it or it
    describes far more than its weights hold (built as ``builder``, e.g. with an LM head; default ``AutoModel``);
    and the capture path its skeleton takes."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(view, local_files_only=True, trust_remote_code=False)
    except Exception as problem:  # noqa: BLE001
        raise CheckpointRefused(f"transformers cannot read this config.json: {first_line(problem)}") from None
    return config, _check_size_before_loading(config, checked.parameters, progress, builder)


def _load_weights(folder: Path, config, dtype: str = "stored", where: dict | None = None,
                  path: str = "interface", progress=None) -> torch.nn.Module:
    """The model on attnviz's recorded fast path (``path`` "interface"), or on transformers' eager attention for
    the models that compute attention in their own code ("hooks", "weights": see :mod:`attnviz.models.eager`),
    from safetensors only, refused if its weights do not fit."""
    from transformers import AutoModel

    tower = architectures.vision_tower(config.model_type)
    loader = getattr(importlib.import_module("transformers"), tower) if tower else AutoModel
    try:
        with loading_lock(progress):
            if progress:
                progress("Reading the weights…")
            model, info = loader.from_pretrained(
                folder,
                **({} if tower else {"config": config}),  # a tower reads its part of the full config itself
                attn_implementation=ATTENTION_NAME if path == "interface" else "eager",
                dtype=DTYPES[dtype],
                **(where or {}),
                local_files_only=True,
                use_safetensors=True,
                trust_remote_code=False,
                output_loading_info=True,
            )
    except Exception as problem:  # noqa: BLE001 - transformers raises many types; all mean "cannot load this"
        raise CheckpointRefused(
            f"transformers could not build this model from its config and weights: {first_line(problem, 300)}"
        ) from None
    expected = len(model.state_dict())
    missing = len(info.get("missing_keys", []))
    if expected and missing / expected > MAX_MISSING_WEIGHT_SHARE:
        raise CheckpointRefused(
            f"{missing} of {expected} weight tensors are missing from the safetensors file: the weights do not "
            f"belong to a {config.model_type} model as config.json says (wrong architecture?)"
        )
    if info.get("mismatched_keys"):
        raise CheckpointRefused("some weights have shapes that do not fit config.json (wrong architecture?)")
    if architectures.capture_path_of(model, config.model_type) != path:
        raise CheckpointRefused(f"the {config.model_type} model built differently from its skeleton")
    if path != "interface":
        try:
            eager.check_weights_come_back(model.eval(), config.model_type,
                                          bool(getattr(config, "is_encoder_decoder", False)),
                                          int(getattr(config, "vocab_size", 0) or 0))
        except ValueError as problem:
            raise CheckpointRefused(f"attnviz cannot show this model: {problem}") from None
    return model.eval()


def load_model_dir(folder: str | Path, name: str | None = None, *, dtype: str = "stored",
                   max_memory: dict | None = None, offload_folder: str | None = None,
                   timings: dict | None = None, progress=None) -> ModelBundle:
    """Load a Hugging Face model folder safely (sharded safetensors too), in its stored dtype or in fp32
    (``dtype`` one of :data:`DTYPES`), placed by :func:`placement`. Raises :class:`CheckpointRefused` with a
    reason to show, whatever goes wrong. ``timings``: a dict that receives each step's seconds (for ``python -m
    attnviz.bench startup``); ``progress(text)``: called at each step (and while waiting for another load).

    Every file transformers reads is checked first (:func:`attnviz.checkpoints.preflight.inspect`), and transformers
    reads them through a view that holds nothing else (:func:`attnviz.checkpoints.preflight.make_view`)."""
    try:
        return _load_model_dir(Path(folder), name, dtype, max_memory, offload_folder,
                               {} if timings is None else timings, progress or (lambda text: None))
    except CheckpointRefused:
        raise
    except Exception as problem:  # noqa: BLE001 - a crafted checkpoint can make transformers raise anything
        raise CheckpointRefused(f"it could not be loaded ({type(problem).__name__}: {first_line(problem, 160)})"
                                ) from None


def _load_model_dir(folder: Path, name, dtype, max_memory, offload_folder, timings: dict, progress) -> ModelBundle:
    _check_request(folder, dtype)
    checked, view, model, path = _checked_model(folder, dtype, max_memory, offload_folder, timings, progress)
    config = model.config  # a CLIP or SigLIP checkpoint: its vision tower's config from here on
    with _timed(timings, "  tokenizer"):
        progress("Reading the tokenizer…")
        modality = "image" if architectures.reads_images(config.model_type) else "text"
        if modality == "image":
            tokenizer, (image_processor, tokenizer_note) = None, load_image_processor(view, config)
        else:
            image_processor, (tokenizer, tokenizer_note) = None, load_tokenizer(checked, view, config)
    with _timed(timings, "  NaN / Inf scan of the weights"):
        nonfinite = nonfinite_weights(model)
    bundle = ModelBundle(
        name=name or folder.name, folder=folder, model=model, tokenizer=tokenizer, tokenizer_note=tokenizer_note,
        **_shape_of(config), n_parameters=sum(p.numel() for p in model.parameters()),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."), placement=_placement_text(model),
        nonfinite=nonfinite, capture_path=path, modality=modality, image_processor=image_processor,
        notes=list(checked.notes),
    )
    with _timed(timings, "  a test sentence"):
        progress("Running it once on a test sentence…")
        check_it_runs(bundle)
    return bundle


def bundle_of_loaded_model(model: torch.nn.Module, tokenizer, *, name: str, folder: Path,
                           capture_path: str) -> ModelBundle:
    """A :class:`ModelBundle` over a text model already built in this process (a notebook's own, never saved),
    described as :func:`load_model_dir` describes a folder's and tried once on a test sentence
    (:func:`attnviz.models.trials.check_it_runs`). ``folder`` names it in the bundle only (nothing is read from it
    here); ``capture_path`` is how its attention is observed (:func:`attnviz.models.architectures.capture_path_of`),
    with its attention implementation already set to match by the caller. Raises :class:`CheckpointRefused` when
    it does not run."""
    bundle = ModelBundle(
        name=name, folder=Path(folder), model=model, tokenizer=tokenizer, tokenizer_note=None,
        **_shape_of(model.config), n_parameters=sum(p.numel() for p in model.parameters()),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."), placement=_placement_text(model),
        nonfinite=nonfinite_weights(model), capture_path=capture_path, modality="text",
    )
    check_it_runs(bundle)
    return bundle


def _check_request(folder: Path, dtype: str) -> None:
    """Refuse a path that is not a folder on the server, or a dtype attnviz does not offer."""
    try:
        if not folder.is_dir():
            raise CheckpointRefused(f"{preflight.shown(folder, 200)} is not a folder on the server")
    except OSError:
        raise CheckpointRefused(f"{preflight.shown(folder, 200)} is not a folder on the server") from None
    if dtype not in DTYPES:
        raise CheckpointRefused(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")


def _checked_model(folder: Path, dtype: str, max_memory, offload_folder, timings: dict, progress):
    """Every file checked, then the model built from a view of them: ``(checked, view, model, capture path)``.
    The view outlives this call as long as the model does (accelerate may read offloaded weights through it)."""
    mark = time.perf_counter()
    progress("Checking the files…")
    checked = preflight.inspect(folder, link_rule_for(folder))
    view = preflight.make_view(checked)
    try:
        progress("Checking the config against the weights…")
        config, path = _read_checked_config(checked, view, progress)
        timings["  checks: config, headers, size on the meta device"] = time.perf_counter() - mark
        with _timed(timings, "  placement (accelerate)"):
            where = placement(view, max_memory=max_memory, offload_folder=offload_folder or str(view / "offload"),
                              size=sum(f.size for f in checked.weights))  # offloaded weights go with the view
        with _timed(timings, "  weights (from_pretrained)"):
            model = _load_weights(view, config, dtype, where, path, progress)
    except BaseException:
        preflight.remove_view(view)
        raise
    preflight.keep_view_while(view, model)
    return checked, view, model, path


@contextlib.contextmanager
def _timed(timings: dict, step: str):
    """``timings[step]``: the seconds the block took (for ``python -m attnviz.bench startup``)."""
    mark = time.perf_counter()
    yield
    timings[step] = time.perf_counter() - mark


def _shape_of(config) -> dict:
    """The ModelBundle fields read from the config: type, architecture and sizes."""
    n_heads = int(getattr(config, "num_attention_heads", 0) or 0)
    return dict(
        model_type=config.model_type,
        architecture=_architecture_of(config),
        n_layers=int(getattr(config, "num_hidden_layers", 0) or 0),
        n_heads=n_heads,
        n_kv_heads=kv_heads_of(config, n_heads),
        d_model=int(getattr(config, "hidden_size", 0) or 0),
        max_positions=_max_positions(config),
    )


def kv_heads_of(config, n_heads: int) -> int:
    """How many K/V heads the model's attention really has (what its KV cache holds). Most configs say it as
    ``num_key_value_heads``; Falcon's ``num_kv_heads`` counts only with its new decoder architecture, and its (and
    GPT-BigCode's) ``multi_query`` means one K/V head: a tiny Falcon with ``multi_query=True`` and
    ``num_kv_heads=4`` caches one."""
    if getattr(config, "num_key_value_heads", None):
        return int(config.num_key_value_heads)
    if getattr(config, "new_decoder_architecture", False) and getattr(config, "num_kv_heads", None):
        return int(config.num_kv_heads)
    if getattr(config, "multi_query", False):
        return 1
    return n_heads


def _max_positions(config) -> int:
    """How many tokens the model reads. RoBERTa-like models spend ``pad_token_id + 1`` rows of their position
    table before the first token (roberta-base: 514 rows, 512 tokens). A vision model: its patches and its
    prefix tokens at its configured image size."""
    if hasattr(config, "image_size") and hasattr(config, "patch_size"):
        size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
        patch = config.patch_size if isinstance(config.patch_size, int) else config.patch_size[0]
        return (size // patch) ** 2 + len(architectures.image_prefix(config.model_type))  # [CLS] (DeiT: and [DIST])
    rows = architectures.declared_positions(config) or 512
    if architectures.positions_after_padding(config.model_type):
        rows -= int(getattr(config, "pad_token_id", 1) or 0) + 1
    return rows


def nonfinite_weights(model: torch.nn.Module) -> list[str]:
    """Names of the weights that hold NaN or infinity (offloaded weights are not on hand and are not read)."""
    return [name for name, parameter in model.named_parameters()
            if parameter.device.type != "meta" and not bool(torch.isfinite(parameter).all())]


# transformers logs a warning for every checkpoint without a tokenizer or with unused weights; the page reports
# what matters itself.
logging.getLogger("transformers.modeling_utils").setLevel(logging.ERROR)
importlib.import_module("transformers").logging.set_verbosity_error()
importlib.import_module("transformers").logging.disable_progress_bar()
