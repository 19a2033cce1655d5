"""The weights transformers will read, resolved and checked before it reads them: ``model.safetensors``, else
the shards ``model.safetensors.index.json`` names, each a plain ``.safetensors`` file of the folder whose header
is parsed and checked here against the file's real size."""

from __future__ import annotations

import json
import math
from pathlib import Path

from attnviz.checkpoints.checked_files import (
    DTYPE_NAMES,
    SINGLE_WEIGHTS,
    WEIGHTS_INDEX,
    CheckedFile,
    LinkRule,
    MiB,
    plain_name_problem,
    read_json,
    regular_file,
    shown,
    whole_number,
)
from attnviz.checkpoints.safety import PICKLE_SUFFIXES, CheckpointRefused

INDEX_LIMIT = 16 * MiB  # the index of a model with 100k tensors is a few MB
MAX_SAFETENSORS_HEADER = 16 * MiB  # a header describes tensors; the largest real ones are a few hundred KB
MAX_SHARDS = 1024
MAX_INDEX_ENTRIES = 1_000_000

# The bytes per element of each safetensors dtype, in bits (F4 and F6 are packed).
SAFETENSORS_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
    "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6,
    "F6_E3M2": 6,
}
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
        if not isinstance(shape, list) or not all(whole_number(size, minimum=0) for size in shape):
            raise CheckpointRefused(f"{broken} (tensor {shown(name)} has an invalid shape)")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(whole_number(o, minimum=0) for o in offsets)
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


def check_index(index: dict) -> dict[str, str]:
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
    weight_map = check_index(read_json(index_file, INDEX_LIMIT))
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
