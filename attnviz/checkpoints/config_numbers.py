"""A config's numbers, checked on its JSON before any model is built: a refusal takes milliseconds and never
waits for :data:`attnviz.models.loading.LOADING`."""

from __future__ import annotations

import json

from attnviz.checkpoints.checked_files import DTYPE_NAMES, SINGLE_WEIGHTS, WEIGHTS_INDEX, shown, whole_number
from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.core.vision import MAX_IMAGE_TOKENS

# Model types whose layers share one set of weights (ALBERT): the checks count one layer's tensors for all of
# them. attnviz.models.architectures' records say the same (a test keeps the two in step)
LAYER_SHARING_TYPES = frozenset({"albert"})

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
MAX_LABELS = 100_000  # id2label / label2id entries (a classification head)
MAX_NESTING = 8


def check_config_numbers(config: dict, tensors: int, parameters: int, path: str = "config.json",
                         depth: int = 0) -> None:
    """Refuse a config whose sizes are not positive whole numbers within bounds (fixed ones, and ones derived from
    the ``tensors`` and ``parameters`` the weights really hold), in it and in every nested sub-config. Cheap: the
    JSON is walked, nothing is built."""
    if depth > MAX_NESTING:
        raise CheckpointRefused(f"{path} nests sub-configs more than {MAX_NESTING} deep")
    if depth == 0 or "model_type" in config:
        _check_model_type(config, path, nested=depth > 0)
    _check_bounds(config, path)
    _check_heads_and_layers(config, tensors, path)
    _check_described_size(config, parameters, path)
    _check_image_tokens(config, path)
    _check_labels_and_dtype(config, path)
    for key, value in config.items():
        if isinstance(value, dict) and (key.endswith("_config") or "model_type" in value):
            check_config_numbers(value, tensors, parameters, f"{path} → {key}", depth + 1)


def _check_model_type(config: dict, path: str, nested: bool = False) -> None:
    """The top level names its type; a nested sub-config may leave it empty (transformers writes ``""`` for
    sub-configs that are not models of their own, such as MPT's ``attn_config``)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise CheckpointRefused(f"{path}'s model_type must be a name (a string), not {type(model_type).__name__}")
    if not model_type and not nested:
        raise CheckpointRefused(f"{path}'s model_type is empty: it must name the model's type")


def _check_bounds(config: dict, path: str) -> None:
    """Every size the config names is a whole number within its :data:`BOUNDS` (a list of image or patch sizes:
    its largest)."""
    for what, (keys, smallest, largest) in BOUNDS.items():
        for key in keys:
            value = config.get(key)
            if value is None:
                continue
            if key in ("image_size", "patch_size") and isinstance(value, list) and value and all(
                    whole_number(v) for v in value):
                value = max(value)
            if not whole_number(value, minimum=smallest) or value > largest:
                raise CheckpointRefused(
                    f"{path}: {key} = {shown(json.dumps(value), 40)} is not a valid number of {what} (a whole number "
                    f"from {smallest} to {largest:,})")


def _check_heads_and_layers(config: dict, tensors: int, path: str) -> None:
    """Heads that fit the width, key/value heads that divide the heads, and no more layers than the weights hold
    tensors for."""
    heads = _first(config, HEAD_KEYS)
    kv_heads = _first(config, KV_HEAD_KEYS)
    width = _first(config, ("hidden_size", "n_embd", "d_model", "dim"))
    if heads and width and heads > width:
        raise CheckpointRefused(f"{path}: {heads} heads cannot share a width of {width}")
    if heads and kv_heads and (kv_heads > heads or heads % kv_heads):
        raise CheckpointRefused(f"{path}: {kv_heads} key/value heads must divide the {heads} query heads")
    layers = _first(config, LAYER_KEYS)
    if layers and config.get("model_type") not in LAYER_SHARING_TYPES and layers > max(tensors // 2, 1):
        # Every layer holds at least two tensors (attention's projections and the MLP's); ALBERT's share one set.
        raise CheckpointRefused(f"{path} describes {layers} layers, but the weights hold only {tensors} tensors (each "
                                "layer has several): the weights do not belong to this config")


def _check_described_size(config: dict, parameters: int, path: str) -> None:
    """A lower bound on what the config describes: the token embeddings; per layer, two width x width projections
    (queries and output) and a feed-forward's two width x intermediate ones; for a mixture of experts, every
    expert of one layer. Far above the weights, and it cannot be built (nor should it be tried)."""
    vocabulary = _first(config, VOCABULARY_KEYS) or 0
    width = _first(config, ("hidden_size", "n_embd", "d_model", "dim")) or 0
    embedding = min(width, config["embedding_size"]) if whole_number(config.get("embedding_size")) else width
    shared = config.get("model_type") in LAYER_SHARING_TYPES
    layers = _first(config, LAYER_KEYS)
    feed_forward = _first(config, ("intermediate_size", "n_inner", "d_ff", "ffn_dim", "encoder_ffn_dim",
                                   "hidden_dim")) or 0
    experts = _first(config, ("num_local_experts", "num_experts", "n_routed_experts")) or 0
    expert_size = config["moe_intermediate_size"] if whole_number(config.get("moe_intermediate_size")) else feed_forward
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


def _check_image_tokens(config: dict, path: str) -> None:
    """No more patches than attnviz reads (the largest image side in the smallest patches)."""
    image, patch = config.get("image_size"), config.get("patch_size")
    image = max(image) if isinstance(image, list) and image and all(whole_number(v) for v in image) else image
    patch = min(patch) if isinstance(patch, list) and patch and all(whole_number(v) for v in patch) else patch
    if whole_number(image) and whole_number(patch) and (image // patch) ** 2 > MAX_IMAGE_TOKENS:
        raise CheckpointRefused(f"{path}: images of {image} pixels in patches of {patch} make "
                                f"{(image // patch) ** 2:,} tokens; attnviz reads up to {MAX_IMAGE_TOKENS:,}")


def _check_labels_and_dtype(config: dict, path: str) -> None:
    for key in ("id2label", "label2id"):
        if isinstance(config.get(key), dict) and len(config[key]) > MAX_LABELS:
            raise CheckpointRefused(f"{path}: {key} has more than {MAX_LABELS:,} labels")
    for key in ("dtype", "torch_dtype"):
        if config.get(key) is not None and config[key] not in DTYPE_NAMES:
            raise CheckpointRefused(f"{path}: {key} = {shown(config[key], 30)} is not a dtype attnviz loads")


def _first(config: dict, keys) -> int | None:
    return next((config[key] for key in keys if whole_number(config.get(key))), None)


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
