"""Everything attnviz checks in a model folder before transformers may read a byte of it.

transformers trusts the folder it is given: it joins every name of ``model.safetensors.index.json`` onto it (an
absolute name or ``../`` leaves it), takes its pickle branch (``torch.load``) when the first shard name is not
``.safetensors``, opens whatever a tokenizer file turns out to be (a FIFO hangs, a link to ``/dev/zero`` reads
forever) and builds a model of whatever size a config describes. So, for every model attnviz loads:

1. :func:`inspect` resolves each file transformers will open to a regular file inside the folder, with a size
   bound checked before it is read: the weights (``model.safetensors``, or the shards an index names, each a plain
   ``.safetensors`` name whose header is read and checked here), ``config.json`` (its numbers checked, below), the
   tokenizer files, ``generation_config.json`` and the image processor's config. A link is followed only where
   :class:`LinkRule` allows (never in an upload); a name that would leave the folder is refused before anything is
   looked up, with words that never say whether a path outside exists.
2. The config's sizes (layers, heads, widths, vocabulary, positions, experts, in every nested sub-config) must be
   positive whole numbers within fixed bounds and bounds derived from the weights' real size, checked on the JSON
   before any model is built: a refusal takes milliseconds and never waits for :data:`loading.LOADING`.
3. transformers then reads a *view* (:func:`make_view`): a private folder of links to the checked files only, so
   that nothing else in the folder (a ``pytorch_model.bin``, a 90 MB README, another index) can be reached.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from attnviz.models.safety import MAX_NAME_BYTES, PICKLE_SUFFIXES, CheckpointRefused
from attnviz.vision import MAX_IMAGE_TOKENS

MiB = 1024**2

SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
CONFIG = "config.json"

# Files read as JSON before or while a model is built: larger than this, the checkpoint is refused.
CONFIG_LIMITS = {CONFIG: 1 * MiB, WEIGHTS_INDEX: 16 * MiB, "generation_config.json": 1 * MiB}
# Optional files: too large, unreadable or not a plain file, and they are left out (the page says so).
IMAGE_PROCESSOR_FILES = {"preprocessor_config.json": 1 * MiB}
# Every file a tokenizer of transformers 5 may open, with its bound. The largest real ones: Gemma 3's
# tokenizer.json (33 MB), its tokenizer_config.json (1.2 MB), Qwen's vocab.json (2.7 MB) and merges.txt (1.7 MB).
TOKENIZER_LIMITS = {
    "tokenizer.json": 64 * MiB, "tokenizer_config.json": 4 * MiB, "special_tokens_map.json": 1 * MiB,
    "added_tokens.json": 4 * MiB, "chat_template.jinja": 1 * MiB, "chat_template.json": 1 * MiB,
    "vocab.txt": 16 * MiB, "vocab.json": 32 * MiB, "merges.txt": 32 * MiB, "dict.txt": 16 * MiB, "bpe.codes": 16 * MiB,
    "spiece.model": 32 * MiB, "sentencepiece.bpe.model": 32 * MiB, "sentencepiece.model": 32 * MiB,
    "tokenizer.model": 32 * MiB, "spm.model": 32 * MiB, "spm_char.model": 32 * MiB, "source.spm": 32 * MiB,
    "target.spm": 32 * MiB, "target_vocab.json": 32 * MiB, "vocab-src.json": 32 * MiB, "vocab-tgt.json": 32 * MiB,
    "entity_vocab.json": 32 * MiB, "tekken.json": 64 * MiB, "emoji.json": 4 * MiB, "normalizer.json": 4 * MiB,
    "byte_maps.json": 4 * MiB, "word_shape.json": 4 * MiB, "word_pronunciation.json": 4 * MiB,
}
TIKTOKEN_LIMIT = 16 * MiB  # *.tiktoken vocabularies (one token per line)
# Entries in one vocabulary file (lines, or JSON keys): real vocabularies stay under 300k; each entry costs a few
# hundred bytes once a tokenizer holds it, so 8M of them took 1.5 GB.
MAX_VOCABULARY_ENTRIES = 1_048_576

MAX_SAFETENSORS_HEADER = 16 * MiB  # a header describes tensors; the largest real ones are a few hundred KB
MAX_SHARDS = 1024
MAX_INDEX_ENTRIES = 1_000_000

# The bytes per element of each safetensors dtype, in bits (F4 and F6 are packed).
SAFETENSORS_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
    "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6,
    "F6_E3M2": 6,
}
# What a config's dtype (or an index's metadata) may name: transformers looks the name up on the torch module.
DTYPE_NAMES = {"float32", "float16", "bfloat16", "float64", "float", "half", "double", "auto"}


@dataclass(frozen=True)
class LinkRule:
    """Where a link inside a model folder may point. Uploads hold plain files only (``allowed=False``); a folder
    on the server may hold links (Hugging Face's cache is made of them) that resolve inside ``root``
    (``ATTNVIZ_MODEL_ROOT``), or anywhere when the server has no root (one local user)."""

    allowed: bool
    root: Path | None = None
    forbidden: tuple[Path, ...] = ()  # never into these (everyone's uploads), wherever the root is


@dataclass
class CheckedFile:
    name: str  # its plain name inside the folder
    real: Path  # the regular file it is (a link's target)
    size: int
    replacement: bytes | None = None  # what the view holds instead (a tokenizer config with path keys left out)


@dataclass
class CheckedFolder:
    """A model folder whose files have passed :func:`inspect`: only these are shown to transformers."""

    folder: Path
    config: dict  # config.json as JSON
    weights: list[CheckedFile]  # model.safetensors, or the shards
    index: CheckedFile | None  # model.safetensors.index.json, for shards
    tensors: int  # tensors in the weights' headers
    parameters: int  # numbers in the weights' headers
    others: list[CheckedFile] = field(default_factory=list)  # generation_config.json, the image processor's config
    tokenizer: list[CheckedFile] = field(default_factory=list)  # empty: no tokenizer (see tokenizer_problem)
    tokenizer_problem: str | None = None  # why the folder's tokenizer is not read, for the page
    notes: list[str] = field(default_factory=list)  # files left out, for the page

    @property
    def files(self) -> list[CheckedFile]:
        return [*self.weights, *([self.index] if self.index else []), *self.others, *self.tokenizer]

    def has(self, name: str) -> bool:
        return any(checked.name == name for checked in self.files)


# ---------------------------------------------------------------------------------------------------------------
# Names and files


def plain_name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain file name that stays in its folder (None if it is)."""
    if not isinstance(name, str) or not name:
        return "it is not a file name"
    if "/" in name or "\\" in name or name in (".", "..") or (len(name) > 1 and name[1] == ":"):
        return "it names a path, not a file of the model's folder"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "it has control characters"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"it is longer than {MAX_NAME_BYTES} bytes"
    return None


def shown(name: object, limit: int = 60) -> str:
    """A name from a checkpoint, safe to print (control characters escaped, shortened)."""
    text = str(name).encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def regular_file(folder: Path, name: str, links: LinkRule) -> CheckedFile | None:
    """The plain file ``name`` in ``folder`` (None if there is none); refused if it is anything but a regular
    file, or a link that :class:`LinkRule` does not allow. Never blocks: a FIFO or a device is seen by
    ``lstat``/``stat``, not opened."""
    problem = plain_name_problem(name)
    if problem:
        raise CheckpointRefused(f"the file name {shown(name)!r} cannot be used: {problem}")
    path = folder / name
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as failure:
        raise CheckpointRefused(f"{shown(name)} cannot be read ({failure.strerror})") from None
    real = path
    if stat.S_ISLNK(info.st_mode):
        if not links.allowed:
            raise CheckpointRefused(f"{shown(name)} is a link; an uploaded checkpoint holds plain files only")
        real = Path(os.path.realpath(path))
        if links.root is not None and real != links.root and links.root not in real.parents:
            raise CheckpointRefused(f"{shown(name)} is a link that points outside {links.root}; files are read from "
                                    "inside that folder only")
        if any(real == place or place in real.parents for place in links.forbidden):
            raise CheckpointRefused(f"{shown(name)} is a link into the uploads of this server; uploaded models open "
                                    "only in the browser that added them")
        try:
            info = os.stat(real)
        except OSError:
            return None  # a dangling link: as if the file were not there
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointRefused(f"{shown(name)} is not a regular file (a folder, a device or a pipe)")
    return CheckedFile(name, real, info.st_size)


def read_json(checked: CheckedFile, limit: int, what: str | None = None):
    """A checked file as JSON, refused if it is larger than ``limit`` (checked before reading), not UTF-8 JSON,
    or nested too deeply for Python's parser."""
    what = what or checked.name
    if checked.size > limit:
        raise CheckpointRefused(f"{what} is {checked.size / MiB:.1f} MB; more than {limit / MiB:g} MB is not a "
                                "file a checkpoint needs")
    try:
        with open(checked.real, "rb") as file:
            data = file.read(limit + 1)
        if len(data) > limit:
            raise CheckpointRefused(f"{what} grew past {limit / MiB:g} MB while it was read")
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as problem:
        raise CheckpointRefused(f"{what} is not valid JSON ({str(problem)[:100]})") from None
    except RecursionError:
        raise CheckpointRefused(f"{what} is nested too deeply to be a real file") from None
    except OSError as failure:
        raise CheckpointRefused(f"{what} cannot be read ({failure.strerror})") from None


# ---------------------------------------------------------------------------------------------------------------
# safetensors headers


def safetensors_header(checked: CheckedFile) -> dict[str, dict]:
    """The tensors a safetensors file describes, ``{name: {"dtype", "shape", "data_offsets"}}``, with every rule
    of the format checked against the file's real size: a bounded header, known dtypes, whole non-negative shapes,
    and offsets that tile the data exactly (no holes, no overlaps, nothing past the end)."""
    broken = f"{shown(checked.name)} is not a readable safetensors file"
    if checked.size < 8:
        raise CheckpointRefused(f"{broken} (it is {checked.size} bytes long)")
    with open(checked.real, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        if length > min(MAX_SAFETENSORS_HEADER, checked.size - 8):
            raise CheckpointRefused(f"{broken} (its header claims {length:,} bytes)")
        raw = file.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise CheckpointRefused(f"{broken} (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointRefused(f"{broken} (its header is not a JSON object)")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointRefused(f"{broken} (its metadata is not a map of strings)")
    data_size = checked.size - 8 - length
    spans = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise CheckpointRefused(f"{broken} (tensor {shown(name)} is not described as the format says)")
        bits = SAFETENSORS_BITS.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
        shape, offsets = entry["shape"], entry["data_offsets"]
        if bits is None:
            raise CheckpointRefused(f"{broken} (tensor {shown(name)} has an unknown dtype)")
        if not isinstance(shape, list) or not all(_whole(size, minimum=0) for size in shape):
            raise CheckpointRefused(f"{broken} (tensor {shown(name)} has an invalid shape)")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_whole(o, minimum=0) for o in offsets)
                or offsets[0] > offsets[1]):
            raise CheckpointRefused(f"{broken} (tensor {shown(name)} has invalid offsets)")
        if math.prod(shape) * bits != (offsets[1] - offsets[0]) * 8:
            raise CheckpointRefused(f"{broken} (tensor {shown(name)}'s bytes do not match its shape and dtype)")
        spans.append((offsets[0], offsets[1]))
    position = 0
    for start, end in sorted(spans):
        if start != position:
            raise CheckpointRefused(f"{broken} (its tensors overlap or leave holes in the data)")
        position = end
    if position != data_size:
        raise CheckpointRefused(f"{broken} (its offsets do not cover the file's {data_size:,} bytes of data)")
    return header


def _whole(value, minimum: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


# ---------------------------------------------------------------------------------------------------------------
# Weights


def _check_index(index: dict) -> dict[str, str]:
    """The index's ``weight_map`` (tensor -> shard name), its shapes and names checked."""
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict) or not index["weight_map"]:
        raise CheckpointRefused(f"{WEIGHTS_INDEX} has no weight_map of tensors to shards")
    if not isinstance(index.get("metadata"), dict):  # transformers reads index["metadata"] unguarded
        raise CheckpointRefused(f"{WEIGHTS_INDEX} has no metadata object (save_pretrained writes one)")
    dtype = index["metadata"].get("dtype")
    if dtype is not None and dtype not in DTYPE_NAMES:
        raise CheckpointRefused(f"{WEIGHTS_INDEX} names an unknown dtype ({shown(dtype, 30)})")
    weight_map = index["weight_map"]
    if len(weight_map) > MAX_INDEX_ENTRIES:
        raise CheckpointRefused(f"{WEIGHTS_INDEX} lists {len(weight_map):,} tensors; real checkpoints list far fewer")
    for tensor, shard in weight_map.items():
        problem = plain_name_problem(shard)
        if problem:
            # Refused on the name alone, before any lookup: the message is the same whether or not it exists.
            raise CheckpointRefused(f"{WEIGHTS_INDEX} maps {shown(tensor)} to {shown(shard)!r}, which cannot be a "
                                    f"shard: {problem}")
        if not shard.endswith(".safetensors"):
            raise CheckpointRefused(f"{WEIGHTS_INDEX} maps {shown(tensor)} to {shown(shard)!r}: every shard must be a "
                                    ".safetensors file (other formats are never opened)")
    if len(set(weight_map.values())) > MAX_SHARDS:
        raise CheckpointRefused(f"{WEIGHTS_INDEX} names more than {MAX_SHARDS} shards")
    return weight_map


def resolve_weights(folder: Path, links: LinkRule) -> tuple[list[CheckedFile], CheckedFile | None, list[dict]]:
    """The weight files transformers will read, as it chooses them (``model.safetensors`` first, else the index),
    each a checked regular ``.safetensors`` file of the folder: ``(weights, index or None, their headers)``."""
    single = regular_file(folder, SINGLE_WEIGHTS, links)
    if single is not None:
        return [single], None, [safetensors_header(single)]
    index_file = regular_file(folder, WEIGHTS_INDEX, links)
    if index_file is None:
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
        if pickles:
            raise CheckpointRefused(
                f"the weights are in pickle format ({', '.join(shown(p) for p in pickles[:3])}), which can run code "
                "when loaded; attnviz never unpickles. Convert them with "
                "`model.save_pretrained(dir, safe_serialization=True)`"
            )
        raise CheckpointRefused(f"no {SINGLE_WEIGHTS} (or {WEIGHTS_INDEX} with its shards) next to config.json")
    weight_map = _check_index(read_json(index_file, CONFIG_LIMITS[WEIGHTS_INDEX]))
    shards, headers = [], []
    for name in sorted(set(weight_map.values())):
        shard = regular_file(folder, name, links)
        if shard is None:
            raise CheckpointRefused(f"{WEIGHTS_INDEX} names the shard {shown(name)}, which is not in the folder")
        shards.append(shard)
        headers.append(safetensors_header(shard))
    # Each tensor is in exactly one shard, the one the index names (transformers reads every tensor of every shard).
    holder: dict[str, str] = {}
    for shard, header in zip(shards, headers, strict=True):
        for tensor in header:
            if tensor in holder:
                raise CheckpointRefused(f"the tensor {shown(tensor)} is in two shards ({shown(holder[tensor])} and "
                                        f"{shown(shard.name)})")
            holder[tensor] = shard.name
    if holder != weight_map:
        differing = sorted(set(holder.items()) ^ set(weight_map.items()))[0][0]
        raise CheckpointRefused(f"{WEIGHTS_INDEX} and its shards disagree about where {shown(differing)} is")
    return shards, index_file, headers


def parameters_of(headers: list[dict]) -> int:
    return sum(math.prod(entry["shape"]) for header in headers for entry in header.values())


# ---------------------------------------------------------------------------------------------------------------
# The config's numbers, checked on the JSON before anything is built

# Sizes a config names, by what they count, with hard bounds far above any real model (Llama 3.1 405B: 126
# layers, 128 heads, width 16,384, 53,248 intermediate; Gemma 3: 262k vocabulary; DeepSeek-V3: 256 experts).
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
              "num_decoder_layers", "num_encoder_layers")
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
             "decoder_attention_heads")
KV_HEAD_KEYS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
WIDTH_KEYS = ("hidden_size", "n_embd", "d_model", "dim", "embedding_size", "word_embed_proj_dim", "head_dim",
              "d_kv", "kv_channels", "projection_dim")
FEED_FORWARD_KEYS = ("intermediate_size", "n_inner", "d_ff", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim",
                     "hidden_dim", "moe_intermediate_size")
VOCABULARY_KEYS = ("vocab_size",)
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "n_shared_experts")
IMAGE_KEYS = ("image_size", "patch_size", "num_channels")
BOUNDS = {  # (keys, smallest, largest)
    "layers": (LAYER_KEYS, 1, 256),
    "heads": (HEAD_KEYS, 1, 1024),
    "key/value heads": (KV_HEAD_KEYS, 1, 1024),
    "widths": (WIDTH_KEYS, 1, 65_536),
    "feed-forward sizes": (FEED_FORWARD_KEYS, 1, 262_144),
    "vocabulary": (VOCABULARY_KEYS, 1, 4_194_304),
    "positions": (POSITION_KEYS, 1, 2_097_152),
    "experts": (EXPERT_KEYS, 0, 512),
    "image sizes": (IMAGE_KEYS, 1, 8_192),
}
SHARED_LAYER_TYPES = {"albert"}  # one set of layer weights used by every layer: their count is not in the files
MAX_LABELS = 100_000  # id2label / label2id entries (a classification head)
MAX_NESTING = 8


def check_config_numbers(config: dict, tensors: int, parameters: int, path: str = "config.json",
                         depth: int = 0) -> None:
    """Refuse a config whose sizes are not positive whole numbers within bounds (fixed ones, and ones derived from
    the ``tensors`` and ``parameters`` the weights really hold), in it and in every nested sub-config. Cheap: the
    JSON is walked, nothing is built."""
    if depth > MAX_NESTING:
        raise CheckpointRefused(f"{path} nests sub-configs more than {MAX_NESTING} deep")
    model_type = config.get("model_type")
    if depth == 0 or "model_type" in config:
        if not isinstance(model_type, str) or not model_type:
            raise CheckpointRefused(f"{path}'s model_type must be a name (a string), not {type(model_type).__name__}")
    for what, (keys, smallest, largest) in BOUNDS.items():
        for key in keys:
            value = config.get(key)
            if value is None:
                continue
            if key == "image_size" and isinstance(value, list) and value and all(_whole(v) for v in value):
                value = max(value)
            if key == "patch_size" and isinstance(value, list) and value and all(_whole(v) for v in value):
                value = max(value)
            if not _whole(value, minimum=smallest) or value > largest:
                raise CheckpointRefused(
                    f"{path}: {key} = {shown(json.dumps(value), 40)} is not a valid number of {what} (a whole number "
                    f"from {smallest} to {largest:,})")
    heads = _first(config, HEAD_KEYS)
    kv_heads = _first(config, KV_HEAD_KEYS)
    width = _first(config, ("hidden_size", "n_embd", "d_model", "dim"))
    if heads and width and heads > width:
        raise CheckpointRefused(f"{path}: {heads} heads cannot share a width of {width}")
    if heads and kv_heads and (kv_heads > heads or heads % kv_heads):
        raise CheckpointRefused(f"{path}: {kv_heads} key/value heads must divide the {heads} query heads")
    layers = _first(config, LAYER_KEYS)
    if layers and model_type not in SHARED_LAYER_TYPES and layers > max(tensors // 2, 1):
        # Every layer holds at least two tensors (attention's projections and the MLP's); ALBERT's share one set.
        raise CheckpointRefused(f"{path} describes {layers} layers, but the weights hold only {tensors} tensors (each "
                                "layer has several): the weights do not belong to this config")
    # A lower bound on what the config describes: the token embeddings; per layer, two width x width projections
    # (queries and output) and a feed-forward's two width x intermediate ones; for a mixture of experts, every
    # expert of one layer. Far above the weights, and it cannot be built (nor should it be tried).
    vocabulary = _first(config, VOCABULARY_KEYS) or 0
    width = width or 0
    embedding = min(width, config["embedding_size"]) if _whole(config.get("embedding_size")) else width
    shared = model_type in SHARED_LAYER_TYPES
    feed_forward = _first(config, ("intermediate_size", "n_inner", "d_ff", "ffn_dim", "encoder_ffn_dim",
                                   "hidden_dim")) or 0
    experts = _first(config, ("num_local_experts", "num_experts", "n_routed_experts")) or 0
    expert_size = config["moe_intermediate_size"] if _whole(config.get("moe_intermediate_size")) else feed_forward
    if experts:
        feed_forward = min(feed_forward, experts * expert_size)  # a MoE layer's experts may replace the dense one
    per_layer = 2 * width**2 + 2 * width * feed_forward
    described = (vocabulary * embedding + (0 if shared else (layers or 0) * per_layer)
                 + 2 * width * expert_size * experts)
    if described > 1.5 * parameters + 1_000_000:
        raise CheckpointRefused(
            f"{path} describes at least {described / 1e6:,.1f}M parameters but the safetensors hold only "
            f"{parameters / 1e6:,.1f}M: the weights do not belong to this config (wrong architecture, or missing "
            "shards?)")
    image, patch = config.get("image_size"), config.get("patch_size")
    image = max(image) if isinstance(image, list) and image and all(_whole(v) for v in image) else image
    patch = min(patch) if isinstance(patch, list) and patch and all(_whole(v) for v in patch) else patch
    if _whole(image) and _whole(patch) and (image // patch) ** 2 > MAX_IMAGE_TOKENS:
        raise CheckpointRefused(f"{path}: images of {image} pixels in patches of {patch} make "
                                f"{(image // patch) ** 2:,} tokens; attnviz reads up to {MAX_IMAGE_TOKENS:,}")
    for key in ("id2label", "label2id"):
        if isinstance(config.get(key), dict) and len(config[key]) > MAX_LABELS:
            raise CheckpointRefused(f"{path}: {key} has more than {MAX_LABELS:,} labels")
    for key in ("dtype", "torch_dtype"):
        if config.get(key) is not None and config[key] not in DTYPE_NAMES:
            raise CheckpointRefused(f"{path}: {key} = {shown(config[key], 30)} is not a dtype attnviz loads")
    for key, value in config.items():
        if isinstance(value, dict) and (key.endswith("_config") or "model_type" in value):
            check_config_numbers(value, tensors, parameters, f"{path} → {key}", depth + 1)


def _first(config: dict, keys) -> int | None:
    return next((config[key] for key in keys if _whole(config.get(key))), None)


def check_config(config: object) -> dict:
    """config.json's content, refused if it is not an object, asks to run code or to read other weights, is
    quantized, or names no architecture transformers knows."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if not isinstance(config, dict):
        raise CheckpointRefused("config.json must hold a JSON object")
    if "auto_map" in config:
        raise CheckpointRefused(
            "config.json has an 'auto_map': this model needs its own Python code (trust_remote_code). attnviz never "
            "runs code from a checkpoint; use an architecture that transformers ships"
        )
    if "transformers_weights" in config:
        raise CheckpointRefused("config.json names a weights file of its own (transformers_weights); attnviz reads "
                                f"only {SINGLE_WEIGHTS} or the shards of {WEIGHTS_INDEX}")
    if "quantization_config" in config:
        raise CheckpointRefused("config.json describes a quantized checkpoint; attnviz reads unquantized safetensors "
                                "weights (fp32, fp16 or bf16)")
    if "model_type" not in config:
        raise CheckpointRefused("config.json has no 'model_type', so the architecture is unknown")
    if not isinstance(config["model_type"], str):
        raise CheckpointRefused(f"config.json's model_type must be a name (a string), not "
                                f"{type(config['model_type']).__name__}")
    if config["model_type"] not in CONFIG_MAPPING:
        raise CheckpointRefused(f"transformers does not know the architecture {shown(config['model_type'])!r}")
    return config


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer and other optional files

# tokenizer_config.json and special_tokens_map.json can name files: keys ending so (transformers 5.24 resolves the
# ones it knows from the folder itself, whatever the config says, but a tokenizer class may open others), and
# ``vocab`` / ``merges`` / ``rewriting_rules`` given as a string, which a tokenizer opens as a path (the Rust
# tokenizer reads /dev/zero until the process aborts). transformers reads a copy with such keys left out.
FILE_KEY_SUFFIXES = ("_file", "_files", "_path", "_dir", "_directory")
PATH_VALUED_KEYS = {"vocab", "merges", "rewriting_rules"}
LABEL_KEYS = {"name_or_path", "_name_or_path"}  # where a checkpoint came from: a label that transformers replaces
TEXT_KEYS = {"chat_template"}  # free text, never opened


def _looks_like_a_path(value: str) -> bool:
    parts = value.replace("\\", "/").split("/")
    return (value.startswith(("/", "~", "\\")) or (len(value) > 1 and value[1] == ":" and value[0].isalpha())
            or ".." in parts)


def sanitised_tokenizer_config(content: object) -> tuple[dict, list[str]]:
    """A tokenizer config without the keys that could make a tokenizer open a file by path, and the keys left out
    that named one (for the page); raises CheckpointRefused if it is not a JSON object."""
    if not isinstance(content, dict):
        raise CheckpointRefused("is not a JSON object")
    kept, named = {}, []
    for key, value in content.items():
        names_files = key.endswith(FILE_KEY_SUFFIXES) and key not in LABEL_KEYS
        path_valued = key in PATH_VALUED_KEYS and isinstance(value, str)
        path_like = (isinstance(value, str) and key not in LABEL_KEYS | TEXT_KEYS and not key.endswith("_token")
                     and _looks_like_a_path(value))
        if key == "auto_map" or names_files or path_valued or path_like:
            if value not in (None, "", [], {}) and key != "auto_map":
                named.append(shown(key, 30))
            continue
        kept[key] = value
    return kept, named


def _count_entries(checked: CheckedFile) -> int:
    """Entries of a vocabulary, counted in chunks without parsing it: lines of a text file; in JSON, keys
    (``"…":``, a vocabulary's entries) and closing brackets followed by a comma (``],``: a unigram vocabulary's
    pairs, a merges list's pairs)."""
    markers = (b'":', b"],") if checked.name.endswith(".json") else (b"\n",)
    count = 0
    with open(checked.real, "rb") as file:
        tail = b""
        while chunk := file.read(MiB):
            window = tail + chunk
            count += sum(window.count(marker) for marker in markers) - sum(tail.count(m) for m in markers)
            tail = chunk[-1:]
    return count


MAX_PIECE_WORK = 1_000_000_000  # sum of squared piece lengths: converting a sentencepiece model costs about this


def sentencepiece_problem(checked: CheckedFile) -> str | None:
    """Why a sentencepiece model (a protobuf) is too costly to read: too many pieces, or pieces so long that
    transformers' conversion to a fast tokenizer (every split of every piece, in Python) would run for hours."""
    data = checked.real.read_bytes()
    pieces = work = 0
    position = 0
    try:
        while position < len(data):
            key, position = _varint(data, position)
            field_number, wire = key >> 3, key & 7
            if wire == 2:
                length, position = _varint(data, position)
                if field_number == 1:  # a SentencePiece message: its field 1 is the piece
                    pieces += 1
                    piece_length = _first_string_length(data, position, position + length)
                    work += piece_length * piece_length
                position += length
            elif wire == 0:
                _, position = _varint(data, position)
            elif wire in (1, 5):
                position += 8 if wire == 1 else 4
            else:
                return "it is not a sentencepiece model"
    except IndexError:
        return "it is not a sentencepiece model"
    if pieces > MAX_VOCABULARY_ENTRIES:
        return f"it has more than {MAX_VOCABULARY_ENTRIES:,} pieces"
    if work > MAX_PIECE_WORK:
        return "its pieces are so long that reading them would take hours"
    return None


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def _first_string_length(data: bytes, start: int, end: int) -> int:
    position = start
    while position < end:
        key, position = _varint(data, position)
        if key & 7 == 2:
            length, position = _varint(data, position)
            if key >> 3 == 1:
                return length
            position += length
        elif key & 7 == 0:
            _, position = _varint(data, position)
        else:
            position += 8 if key & 7 == 1 else 4
    return 0


SENTENCEPIECE_SUFFIXES = (".model", ".spm")
COUNTED_JSON = {"tokenizer.json", "tekken.json", "vocab.json", "target_vocab.json", "vocab-src.json", "vocab-tgt.json"}


def check_tokenizer(folder: Path, links: LinkRule) -> tuple[list[CheckedFile], str | None, list[str]]:
    """The folder's tokenizer files, each a checked regular file within its bound, or ``([], why, notes)``: then
    no tokenizer file is read at all (a stand-in tokenizer is used, and the page says why). The tokenizer configs
    are replaced in the view by copies without keys that name files (listed in the notes)."""
    found, notes = [], []
    names = list(TOKENIZER_LIMITS) + sorted(p.name for p in folder.iterdir() if p.name.endswith(".tiktoken"))
    for name in names:
        limit = TOKENIZER_LIMITS.get(name, TIKTOKEN_LIMIT)
        try:
            checked = regular_file(folder, name, links)
        except CheckpointRefused as problem:
            return [], f"Its tokenizer file {problem}", notes
        if checked is None:
            continue
        if checked.size > limit:
            return [], (f"Its tokenizer file {shown(name)} is {checked.size / MiB:.1f} MB, larger than "
                        f"{limit / MiB:g} MB, so it was not read"), notes
        counted = name.endswith((".txt", ".codes", ".tiktoken")) or name in COUNTED_JSON
        # A merges list holds about one pair per vocabulary entry: JSON vocabularies may hold both.
        allowed = 2 * MAX_VOCABULARY_ENTRIES if name in ("tokenizer.json", "tekken.json") else MAX_VOCABULARY_ENTRIES
        if counted and _count_entries(checked) > allowed:
            return [], (f"Its tokenizer file {shown(name)} has more than {allowed:,} entries, so it was not "
                        "read"), notes
        if name.endswith(SENTENCEPIECE_SUFFIXES):
            problem = sentencepiece_problem(checked)
            if problem:
                return [], f"Its tokenizer file {shown(name)} cannot be used: {problem}", notes
        if name in ("tokenizer_config.json", "special_tokens_map.json"):
            try:
                content, named = sanitised_tokenizer_config(read_json(checked, limit))
            except CheckpointRefused as refused:
                return [], f"Its tokenizer file {name} {refused}", notes
            if named:
                notes.append(f"Left out of {name}: {', '.join(named)} (it named files by path; the tokenizer reads "
                             "its files from the checkpoint's own folder only)")
            checked.replacement = json.dumps(content).encode()
        found.append(checked)
    return found, None, notes


def check_optional(folder: Path, links: LinkRule, name: str, limit: int) -> tuple[CheckedFile | None, str | None]:
    """An optional JSON file (generation or image-processor config): ``(checked file, None)``, ``(None, None)``
    when absent, or ``(None, why it is left out)``."""
    try:
        checked = regular_file(folder, name, links)
        if checked is not None:
            content = read_json(checked, limit)
            if not isinstance(content, dict):
                raise CheckpointRefused(f"{name} must hold a JSON object")
    except CheckpointRefused as problem:
        return None, f"{problem}; it was left out"
    return checked, None


# ---------------------------------------------------------------------------------------------------------------
# The whole folder


def inspect(folder: str | Path, links: LinkRule) -> CheckedFolder:
    """Check everything transformers will read in ``folder`` (see the module's docstring), following links only
    as ``links`` allows (:func:`attnviz.models.uploads.link_rule_for`); raises :class:`CheckpointRefused` with
    the reason. Reads only headers, JSON and sizes: milliseconds."""
    folder = Path(folder)
    config_file = regular_file(folder, CONFIG, links)
    if config_file is None:
        raise CheckpointRefused("no config.json found: a Hugging Face model folder needs one")
    config = check_config(read_json(config_file, CONFIG_LIMITS[CONFIG]))
    weights, index, headers = resolve_weights(folder, links)
    parameters = parameters_of(headers)
    tensors = sum(len(header) for header in headers)
    check_config_numbers(config, tensors, parameters)
    checked = CheckedFolder(folder, config, weights, index, tensors, parameters)
    checked.others.append(CheckedFile(CONFIG, config_file.real, config_file.size))
    for name, limit in (("generation_config.json", CONFIG_LIMITS["generation_config.json"]),
                        *IMAGE_PROCESSOR_FILES.items()):
        optional, note = check_optional(folder, links, name, limit)
        if optional is not None:
            checked.others.append(optional)
        elif note:
            checked.notes.append(note + ".")
    checked.tokenizer, checked.tokenizer_problem, notes = check_tokenizer(folder, links)
    checked.notes += notes
    return checked


def make_view(checked: CheckedFolder) -> Path:
    """A private folder holding links to the checked files only, for transformers to read (it cannot reach
    anything else of the model's folder). Give it to :func:`keep_view_while` once a model is built from it, or
    :func:`remove_view` it."""
    from attnviz.models.disk import WORKSPACE_PREFIX, uploads_root

    try:
        place = uploads_root()
    except CheckpointRefused:
        place = None  # the system's temporary folder: the name still marks it as an upload's, never opened by path
    view = Path(tempfile.mkdtemp(prefix=f"{WORKSPACE_PREFIX}view-", dir=place))
    for checked_file in checked.files:
        if checked_file.replacement is not None:
            (view / checked_file.name).write_bytes(checked_file.replacement)
        else:
            os.symlink(checked_file.real, view / checked_file.name)
    return view


def keep_view_while(view: Path, owner: object) -> None:
    """Remove ``view`` when ``owner`` (the model built from it) is collected, and at the latest at exit."""
    weakref.finalize(owner, shutil.rmtree, view, ignore_errors=True)


def remove_view(view: Path) -> None:
    shutil.rmtree(view, ignore_errors=True)
