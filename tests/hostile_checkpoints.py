"""Checkpoints an attacker would craft, as files on disk: each :class:`Case` builds one and says what must happen.

The cases go through the same functions the Checkpoints page calls (``prepare_zip``, ``prepare_single_files``,
``prepare_folder_path``, then ``load_model_dir``), each in a child process with a memory cap and a time limit
(:mod:`tests.hostile_runner`), and the test (:mod:`tests.test_hostile_checkpoints`) asserts on what the child
saw: a refusal with a clear reason (or a clean load where the file is harmless), nothing read from outside the
upload (a sentinel checkpoint and a sentinel vocabulary outside it, whose values would show), nothing unpickled
(a payload that would leave a file behind), no hang, and a small model loading quickly beside the hostile one.

:func:`build_all` writes every case under one folder and returns the JSON the runner reads.
"""

from __future__ import annotations

import io
import json
import os
import struct
import warnings
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

SENTINEL_VALUE = 1234.5  # every weight of the sentinel checkpoint outside the uploads
SENTINEL_TOKEN = "zzsentineltokenzz"  # a token only the sentinel vocabulary outside the uploads has
MiB = 1024**2


@dataclass
class Case:
    name: str
    kind: str  # "zip", "files" or "folder"
    path: str = ""  # the zip, the folder of files to upload, or the server folder (or the typed text)
    expect: str = "refused"  # or "loads"
    match: str = ""  # a regular expression the refusal (or, for "loads", a note) must match
    model_root: str = ""  # ATTNVIZ_MODEL_ROOT for the case
    fast: bool = False  # the refusal must come in well under a second (and never wait for LOADING)
    nonfinite: bool = False  # loads, and capture must name NaN/inf and the replay check must say so
    fallback_tokenizer: bool = False  # loads with the stand-in tokenizer
    absent: list[str] = field(default_factory=list)  # files that must not be in the prepared folder
    causal: bool = False  # loaded as the Generation page loads a decoder (load_causal_lm), not load_model_dir
    masked: bool = False  # loaded as head importance loads an encoder with its masked-LM head (load_masked_lm)
    image: bool = False  # a vision transformer: captured on an image


# ---------------------------------------------------------------------------------------------------------------
# Pieces


class Payload:
    """Unpickled, it would run a shell command that leaves ``marker`` behind."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def pickle_bytes(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save({"weight": Payload(str(marker))}, buffer)
    return buffer.getvalue()


def zip_of(files: dict[str, bytes], *, method: int = zipfile.ZIP_STORED) -> bytes:
    """A zip of ``files`` (stored: quick to make; a case that needs compression asks for deflate)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def shards_of(tiny: Path) -> dict[str, bytes]:
    """The tiny checkpoint's weights split into two shards with their index (as save_pretrained writes them)."""
    from safetensors.torch import load_file, save

    tensors = load_file(tiny / "model.safetensors")
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    files, weight_map = {}, {}
    for shard, members in halves.items():
        files[shard] = save({n: tensors[n] for n in members}, metadata={"format": "pt"})
        weight_map.update({n: shard for n in members})
    files["model.safetensors.index.json"] = index_json(weight_map)
    return files


def index_json(weight_map: dict, metadata: object = None) -> bytes:
    return json.dumps({"metadata": {"total_size": 0} if metadata is None else metadata,
                       "weight_map": weight_map}).encode()


def with_config(files: dict[str, bytes], **changes) -> dict[str, bytes]:
    config = json.loads(files["config.json"])
    config.update(changes)
    return {**files, "config.json": json.dumps(config).encode()}


def set_zip_field(data: bytes, name: str, *, central: dict | None = None, local: dict | None = None) -> bytes:
    """A zip with fields of ``name``'s central directory entry and local header changed (byte offsets as the
    zip format gives them), to craft damaged or lying archives."""
    data = bytearray(data)
    encoded = name.encode()
    at = data.find(b"PK\x01\x02" + b"", 0)
    while at >= 0:
        length = struct.unpack_from("<H", data, at + 28)[0]
        if bytes(data[at + 46: at + 46 + length]) == encoded:
            for offset, (fmt, value) in (central or {}).items():
                struct.pack_into(fmt, data, at + offset, value)
            local_at = struct.unpack_from("<I", data, at + 42)[0]
            for offset, (fmt, value) in (local or {}).items():
                struct.pack_into(fmt, data, local_at + offset, value)
            return bytes(data)
        at = data.find(b"PK\x01\x02", at + 4)
    raise KeyError(name)


# ---------------------------------------------------------------------------------------------------------------
# The cases


def build_all(root: Path, tiny: Path) -> tuple[list[Case], dict]:
    """Write every case under ``root`` (``tiny``: a small GPT-2 folder with tokenizer files). Returns the cases
    and the facts the runner needs (sentinel and marker paths, the small model)."""
    root = Path(root)
    secret = root / "secret"  # outside every upload: must never be read
    secret.mkdir(parents=True)
    from safetensors.torch import load_file, save_file

    tensors = load_file(tiny / "model.safetensors")
    save_file({n: torch.full_like(t, SENTINEL_VALUE) for n, t in tensors.items()}, secret / "secret.safetensors",
              metadata={"format": "pt"})
    vocab = (tiny / "vocab.txt").read_text().splitlines()  # the sentinel takes an unused token's place: read, it
    vocab[vocab.index("[unused0]")] = SENTINEL_TOKEN       # would be a vocabulary that fits the model
    (secret / "vocab.txt").write_text("\n".join(vocab) + "\n")
    marker = root / "unpickled-marker"
    payload = pickle_bytes(marker)
    base = folder_files(tiny)
    unweighted = {n: d for n, d in base.items() if n != "model.safetensors"}
    sharded = {**unweighted, **shards_of(tiny)}
    shard_names = sorted(n for n in sharded if n.endswith(".safetensors"))
    weight_map = json.loads(sharded["model.safetensors.index.json"])["weight_map"]

    def pointing(target: str, every: bool = False) -> dict[str, bytes]:
        """The sharded files with the index pointing one shard's tensors (or all) at ``target``."""
        changed = {t: (target if every or s == shard_names[0] else s) for t, s in weight_map.items()}
        return {**sharded, "model.safetensors.index.json": index_json(changed)}

    cases: list[Case] = []
    zips = root / "zips"
    zips.mkdir()

    def zip_case(name: str, files_or_bytes, filename: str = "evil.zip", **expect) -> None:
        data = files_or_bytes if isinstance(files_or_bytes, bytes) else zip_of(files_or_bytes)
        folder = zips / f"{len(cases):03d}"
        folder.mkdir()
        (folder / filename).write_bytes(data)
        cases.append(Case(name, "zip", str(folder / filename), **expect))

    # 1. The shard index reaches outside the upload
    zip_case("index: a shard by absolute path (the sentinel)", pointing(str(secret / "secret.safetensors"), True),
             match="cannot be a shard")
    zip_case("index: a shard up and out with ../", pointing("../../../secret/secret.safetensors", True),
             match="cannot be a shard")
    zip_case("index: /dev/zero as a shard", pointing("/dev/zero"), match="cannot be a shard", fast=True)
    zip_case("index: a shard with a backslash", pointing("..\\..\\secret.safetensors"), match="cannot be a shard")
    zip_case("index: a shard name with a NUL byte", pointing("model\x00.safetensors"), match="cannot be a shard")
    zip_case("index: the folder itself as a shard", pointing("."), match="cannot be a shard")
    zip_case("index: a shard that is not there", pointing("model-00009-of-00009.safetensors"),
             match="not in the upload")
    zip_case("index: weight_map is a list", {**sharded, "model.safetensors.index.json": b'{"metadata": {}, '
                                                                                        b'"weight_map": [1]}'},
             match="no weight_map")
    zip_case("index: no metadata", {**sharded, "model.safetensors.index.json": json.dumps(
        {"weight_map": weight_map}).encode()}, match="no metadata")
    zip_case("index: an unknown dtype in its metadata", {**sharded, "model.safetensors.index.json": index_json(
        weight_map, {"dtype": "load"})}, match="unknown dtype")
    moved = dict(weight_map)
    moved[next(iter(moved))] = shard_names[1] if moved[next(iter(moved))] == shard_names[0] else shard_names[0]
    zip_case("index: disagrees with its shards", {**sharded, "model.safetensors.index.json": index_json(moved)},
             match="disagree")
    entries = ",".join(f'"t{i}":"{shard_names[0]}"' for i in range(1_000_001))  # written as text: json is slow
    zip_case("index: 1,000,001 entries", {**sharded, "model.safetensors.index.json":
                                          f'{{"metadata":{{}},"weight_map":{{{entries}}}}}'.encode()},
             match="larger than|lists 1,000,001")
    # 2. Pickles, whatever they are called
    zip_case("index: the first shard a pickle named a.txt", {**pointing("a.txt"), "a.txt": payload},
             match="must be a .safetensors file")
    zip_case("a pickle named model.safetensors", {**unweighted, "model.safetensors": payload},
             match="not a readable safetensors file")
    zip_case("a pickle shard named like safetensors", {**sharded, shard_names[0]: payload},
             match="not a readable safetensors file")
    zip_case("only pickles (pytorch_model.bin)", {**unweighted, "pytorch_model.bin": payload},
             match="no model.safetensors")
    zip_case("config: transformers_weights names a pickle", with_config(
        {**base, "adapter_model.bin": payload}, transformers_weights="adapter_model.bin"),
        match="transformers_weights")
    # 3. Configs that would build forever or nonsense
    for field_name, value, match in [
        ("n_layer", 20_000, "layers"), ("n_layer", 10**6, "layers"), ("n_layer", 200, "weights hold only"),
        ("n_head", -4, "heads"), ("n_head", 0, "heads"), ("n_head", 2.5, "heads"), ("n_head", "4", "heads"),
        ("n_head", True, "heads"), ("n_embd", 10**9, "widths"), ("vocab_size", 10**12, "vocabulary"),
        ("n_positions", 10**9, "positions"), ("n_inner", -1, "feed-forward"), ("n_head", 64, "cannot share"),
    ]:
        zip_case(f"config: {field_name} = {value!r}", with_config(base, **{field_name: value}), match=match,
                 fast=True)
    zip_case("config: n_embd 4096 with 0.1M-parameter weights", with_config(base, n_embd=4096, n_head=32),
             match="safetensors hold only", fast=True)
    zip_case("config: model_type is a list", with_config(base, model_type=["gpt2"]), match="model_type", fast=True)
    zip_case("config: model_type is a dict", with_config(base, model_type={"a": 1}), match="model_type", fast=True)
    zip_case("config: model_type is a number", with_config(base, model_type=7), match="model_type", fast=True)
    zip_case("config: nested 100,000 deep", {**base, "config.json": b"[" * 100_000 + b"]" * 100_000},
             match="nested too deeply", fast=True)
    zip_case("config: 2 MB of config", {**base, "config.json": json.dumps(
        {**json.loads(base["config.json"]), "padding": "x" * 2 * MiB}).encode()}, match="larger than|MiB", fast=True)
    zip_case("config: a vision_config of width 10^9", with_config(base, vision_config={"hidden_size": 10**9}),
             match="widths", fast=True)
    zip_case("config: an auto_map", with_config(base, auto_map={"AutoModel": "evil.Model"}), match="auto_map",
             fast=True)
    zip_case("config: a quantization_config", with_config(base, quantization_config={"quant_method": "gptq"}),
             match="quantized", fast=True)
    zip_case("config: dtype names a torch function", with_config(base, torch_dtype="load"), match="dtype", fast=True)
    zip_case("config: an empty text_config", with_config(base, text_config={}),
             match="does not run on a test sentence")
    zip_case("config: 512 experts of a 262,144-wide feed-forward", with_config(base, num_local_experts=512,
                                                                              n_inner=262_144),
             match="safetensors hold only", fast=True)
    zip_case("config: a 262,144-wide feed-forward", with_config(base, n_inner=262_144), match="safetensors hold only",
             fast=True)
    zip_case("config: 3 key/value heads for 4 heads (llama)", with_config(base, num_key_value_heads=3),
             match="key/value heads", fast=True)
    # 4. Tokenizer files of any size
    big_tokenizer_config = json.dumps({"padding": "x" * 5 * MiB}).encode()
    zip_case("tokenizer_config.json of 5 MB", {**base, "tokenizer_config.json": big_tokenizer_config}, expect="loads",
             match="tokenizer_config.json \\(larger than", absent=["tokenizer_config.json"])
    zip_case("vocab.txt of 2M entries", {**base, "vocab.txt": b"a\n" * 2_000_000}, expect="loads",
             fallback_tokenizer=True, match="more than 1,048,576 entries")
    zip_case("merges.txt of 40 MB", zip_of({**base, "merges.txt": b"a b\n" * (10 * MiB)}, method=zipfile.ZIP_DEFLATED),
             expect="loads",
             match="merges.txt \\(larger than", absent=["merges.txt"])
    zip_case("special_tokens_map.json of 2 MB", {**base, "special_tokens_map.json": json.dumps(
        {"x": "y" * 2 * MiB}).encode()}, expect="loads", match="special_tokens_map.json \\(larger than")
    zip_case("added_tokens.json of 5 MB", {**base, "added_tokens.json": json.dumps(
        {f"tok{i}": i for i in range(400_000)}).encode()}, expect="loads", match="added_tokens.json \\(larger than")
    tokenizer_config = json.loads(base["tokenizer_config.json"])
    zip_case("tokenizer_config: vocab_file outside (the sentinel)", {**base, "tokenizer_config.json": json.dumps(
        {**tokenizer_config, "vocab_file": str(secret / "vocab.txt")}).encode()}, expect="loads",
        match="Left out of tokenizer_config.json: vocab_file")
    zip_case("tokenizer_config: fast_tokenizer_files climbing out", {**base, "tokenizer_config.json": json.dumps(
        {**tokenizer_config, "fast_tokenizer_files": ["tokenizer./../../../secret/x.json"]}).encode()},
        expect="loads", match="Left out of tokenizer_config.json: fast_tokenizer_files")
    no_fast = {n: d for n, d in base.items() if n != "tokenizer.json"}  # the vocabulary then comes from the config
    for key, target, said in [("vocab", str(secret / "vocab.txt"), "the sentinel's path"),
                              ("vocab", "/dev/zero", "/dev/zero"), ("merges", "/dev/zero", "/dev/zero"),
                              ("vocab", "vocab.txt", "a name relative to the server's folder"),
                              ("rewriting_rules", "/dev/zero", "/dev/zero")]:
        zip_case(f"tokenizer_config: {key} = {said} (no tokenizer.json)", {**no_fast, "tokenizer_config.json":
                 json.dumps({**tokenizer_config, key: target}).encode()}, expect="loads",
                 match=f"Left out of tokenizer_config.json: {key}")
    zip_case("special_tokens_map: a path-valued entry", {**base, "special_tokens_map.json": json.dumps(
        {"unk_token": "[UNK]", "vocab": "/dev/zero"}).encode()}, expect="loads",
        match="Left out of special_tokens_map.json: vocab")
    fast = json.loads(base["tokenizer.json"])
    marker = "ZZVOCABULARYZZ"
    start = len(fast["model"]["vocab"])
    more = ",".join(f'"{i:x}":{start + i}' for i in range(2_200_000))  # written as text: json is slow
    text = json.dumps({**fast, "model": {**fast["model"], "vocab": {**fast["model"]["vocab"], marker: 0}}})
    zip_case("tokenizer.json of 2.2M entries (under its byte bound)", {**base, "tokenizer.json": text.replace(
        f'"{marker}": 0', more).encode()}, expect="loads", fallback_tokenizer=True,
        match="more than 2,097,152 entries")
    far = dict(fast["model"]["vocab"], zebra=10_000_000)
    zip_case("tokenizer.json: an id far past the model's vocabulary", {**base, "tokenizer.json": json.dumps(
        {**fast, "model": {**fast["model"], "vocab": far}}).encode()}, expect="loads", fallback_tokenizer=True,
        match="token ids up to 10,000,000")
    zip_case("tokenizer.model: pieces of 60,000 characters (hours of conversion)", {
        **no_fast, "tokenizer.model": _sentencepiece([("a" * (60_000 - k)) for k in range(20)]),
        "tokenizer_config.json": json.dumps({"tokenizer_class": "LlamaTokenizer"}).encode()}, expect="loads",
        fallback_tokenizer=True, match="take hours")
    zip_case("generation_config.json of 2 MB", {**base, "generation_config.json": json.dumps(
        {"x": "y" * 2 * MiB}).encode()}, expect="loads", match="generation_config.json \\(larger than")
    # 5. Zips that are damaged or odd
    good = zip_of(base, method=zipfile.ZIP_DEFLATED)
    zip_case("zip: a bad CRC", set_zip_field(good, "config.json", central={16: ("<I", 0)}, local={14: ("<I", 0)}),
             match="damaged")
    zip_case("zip: the central directory lies about a size", set_zip_field(
        good, "model.safetensors", central={24: ("<I", 600 * MiB)}), match="zip bomb|damaged")
    stored = zip_of(base, method=zipfile.ZIP_STORED)
    zip_case("zip: an entry 10 bytes longer than it says", set_zip_field(
        stored, "config.json", central={24: ("<I", 10)}, local={22: ("<I", 10)}), match="damaged|more than")
    zip_case("zip: encrypted", set_zip_field(good, "config.json", central={8: ("<H", 1)}, local={6: ("<H", 1)}),
             match="encrypted")
    zip_case("zip: an unknown compression method", set_zip_field(good, "config.json", central={10: ("<H", 99)},
                                                                 local={8: ("<H", 99)}), match="compression")
    zip_case("zip: x.json beside x.json/y.json", {**base, "x.json": b"{}", "x.json/y.json": b"{}"}, expect="loads")
    duplicate = io.BytesIO()
    with zipfile.ZipFile(duplicate, "w") as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name": the point of the case
        for name, data in base.items():
            archive.writestr(name, data)
        archive.writestr("config.json", b'{"model_type": "bert"}')
    zip_case("zip: config.json twice", duplicate.getvalue(), match="twice")
    zip_case("zip: named extracted.zip, in a wrapper folder", {f"extracted/{n}": d for n, d in base.items()},
             filename="extracted.zip", expect="loads")
    zip_case("zip: a README.md of 30 MB compressed 1000:1", zip_of({**base, "README.md": b"\0" * 30 * MiB},
                                                                  method=zipfile.ZIP_DEFLATED),
             expect="loads", absent=["README.md"])
    zip_case("zip: a path climbing out", {**base, "../../evil.json": b"{}"}, match="climbs out")
    zip_case("zip: an absolute path", {**base, "/tmp/evil.json": b"{}"}, match="absolute path")
    link = io.BytesIO()
    with zipfile.ZipFile(link, "w") as archive:
        for name, data in base.items():
            archive.writestr(name, data)
        info = zipfile.ZipInfo("vocab2.txt")
        info.external_attr = (0o120777) << 16
        archive.writestr(info, str(secret / "vocab.txt"))
    zip_case("zip: a symbolic link", link.getvalue(), match="symbolic link")
    zip_case("zip: 201 entries", {**base, **{f"junk/{i}.txt": b"x" for i in range(201)}}, match="entries")
    zip_case("zip: two models", {**{f"a/{n}": d for n, d in base.items()}, **{f"b/{n}": d for n, d in base.items()}},
             match="several config.json")
    # 6. Numbers that overflow: loads, and every page must say "not finite"
    from safetensors.torch import save as save_bytes

    huge = {n: (torch.full_like(t, 1e38) if "attn.c_attn.weight" in n else t) for n, t in tensors.items()}
    zip_case("weights of 1e38", {**base, "model.safetensors": save_bytes(huge, metadata={"format": "pt"})},
             expect="loads", nonfinite=True)
    zip_case("config: layer_norm_epsilon NaN", with_config(base, layer_norm_epsilon=float("nan")), expect="loads",
             nonfinite=True)

    # The Generation page's loader: the same checks
    neo = _tiny_gpt_neo(root / "gpt-neo", max_position_embeddings=30_000)
    zip_case("load_causal_lm: gpt_neo with 30,000 positions (9e8-number tables per layer)", folder_files(neo),
             match="tables", causal=True)
    zip_case("load_causal_lm: an index climbing out", pointing("../../secret/secret.safetensors", True),
             match="cannot be a shard", causal=True)
    zip_case("load_causal_lm: tokenizer_config vocab = /dev/zero", {**no_fast, "tokenizer_config.json": json.dumps(
        {**tokenizer_config, "vocab": "/dev/zero"}).encode()}, expect="loads", causal=True)

    for name, settings, match in [
        ("forced_bos_token_id = 10,000,000", {"forced_bos_token_id": 10_000_000}, "forced_bos_token_id"),
        ("forced_bos_token_id = -1 (silently the last token)", {"forced_bos_token_id": -1}, "forced_bos_token_id"),
        ("suppress_tokens past the vocabulary", {"suppress_tokens": [10_000_000]}, "suppress_tokens"),
        ("bad_words_ids negative", {"bad_words_ids": [[-99_999_999]]}, "bad_words_ids"),
    ]:
        zip_case(f"load_causal_lm: generation_config {name}", {**base, "generation_config.json": json.dumps(
            settings).encode()}, match=match, causal=True)
    t5 = _tiny_seq2seq(root / "t5")
    t5_files = folder_files(t5)
    zip_case("load_causal_lm: t5 decoder_start_token_id past the vocabulary", with_config(
        t5_files, decoder_start_token_id=10_000_000), match="decoder_start_token_id", causal=True)

    # Head importance's masked-LM loader: the same checks, and no head made up at random
    bert = folder_files(_tiny_masked_lm(root / "bert-mlm"))
    zip_case("load_masked_lm: an index climbing out", with_config(pointing("../../secret/secret.safetensors", True),
                                                                  architectures=["BertForMaskedLM"]),
             match="cannot be a shard", masked=True)
    headless = folder_files(_tiny_masked_lm(root / "bert-headless", head=False))
    zip_case("load_masked_lm: says BertForMaskedLM, holds no head", with_config(
        headless, architectures=["BertForMaskedLM"]), match="no masked-LM head", masked=True)
    zip_case("load_masked_lm: a BERT with its head", bert, expect="loads", masked=True)

    # Vision transformers: what the image processor asks for is bounded too
    from attnviz.bench.tiny import make_tiny_vision_checkpoint

    vit = folder_files(make_tiny_vision_checkpoint("vit", root / "vit", image_size=32))
    processor = json.loads(vit["preprocessor_config.json"])
    for name, changes, match in [
        ("size 20,000 x 20,000", {"size": {"height": 20_000, "width": 20_000}}, "size height is 20000"),
        ("crop_size 10^9", {"crop_size": {"height": 10**9, "width": 10**9}, "do_center_crop": True}, "crop_size"),
        ("size 2,048 (65,536 patches)", {"size": {"height": 2048, "width": 2048}}, "16,384 patches"),
        ("rescale_factor a string", {"rescale_factor": "x"}, "cannot be used"),
        ("image_mean of one number", {"image_mean": [0.5]}, "cannot be used"),
        ("image_std of zeros", {"image_std": [0, 0, 0]}, "NaN or infinite"),
        ("another model's processor class", {"image_processor_type": "Qwen2VLImageProcessor"}, "cannot be used"),
    ]:
        zip_case(f"vision: preprocessor {name}", {**vit, "preprocessor_config.json": json.dumps(
            {**processor, **changes}).encode()}, expect="loads", match=match, image=True)
    zip_case("vision: images of 512 pixels in patches of 1 (262,144 tokens)", with_config(
        vit, image_size=512, patch_size=1), match="tokens", fast=True)

    # A shared layer (ALBERT) declared far more often than its weights were made for: cost counts layer calls
    from attnviz.bench.tiny import make_tiny_checkpoint, tiny_config

    shape = tiny_config("albert")
    shape.update({"hidden_size": 128, "intermediate_size": 512})
    albert = folder_files(make_tiny_checkpoint("albert", root / "albert", config=shape))
    zip_case("config: ALBERT's shared layer run 256 times", with_config(albert, num_hidden_layers=256),
             match="runs its shared layers 256 times")
    zip_case("config: ALBERT's shared layer run 12 times", with_config(albert, num_hidden_layers=12), expect="loads")

    # The files tab
    def files_case(name: str, files: dict[str, bytes], **expect) -> None:
        folder = root / "files" / f"{len(cases):03d}"
        folder.mkdir(parents=True)
        (folder / "files.json").write_text(json.dumps(list(files)))
        for index, data in enumerate(files.values()):
            (folder / str(index)).write_bytes(data)
        cases.append(Case(name, "files", str(folder), **expect))

    files_case("files: shards with an index climbing out", pointing("../../secret/secret.safetensors", True),
               match="cannot be a shard")
    files_case("files: shards with /dev/zero in the index", pointing("/dev/zero"), match="cannot be a shard")
    files_case("files: a pickle named a.txt as the first shard", {**pointing("a.txt"), "a.txt": payload},
               match="must be a .safetensors file")
    files_case("files: two shards and no index", {n: d for n, d in sharded.items()
                                                  if n != "model.safetensors.index.json"}, match="no model.safetensors")
    files_case("files: a name with an escape sequence", {**base, "vocab\x1b[2J.txt": b"a"}, match="control")
    files_case("files: the sharded checkpoint", sharded, expect="loads")

    # Folders on the server, inside ATTNVIZ_MODEL_ROOT
    models = root / "models"
    models.mkdir()

    def folder_case(name: str, files: dict[str, bytes], extra=None, typed: str | None = None, rooted: bool = True,
                    **expect) -> None:
        folder = models / f"{len(cases):03d}"
        folder.mkdir()
        for file_name, data in files.items():
            (folder / file_name).write_bytes(data)
        if extra:
            extra(folder)
        cases.append(Case(name, "folder", typed if typed is not None else str(folder),
                          model_root=str(models) if rooted else "", **expect))

    def link(name: str, target):
        return lambda folder: (folder / name).unlink(missing_ok=True) or os.symlink(target, folder / name)

    def fifo(name: str):
        return lambda folder: (folder / name).unlink(missing_ok=True) or os.mkfifo(folder / name)

    folder_case("folder: index by absolute path (the sentinel)", pointing(str(secret / "secret.safetensors"), True),
                match="cannot be a shard")
    folder_case("folder: model.safetensors a link to the sentinel", base,
                link("model.safetensors", secret / "secret.safetensors"), match="points outside")
    folder_case("folder: model.safetensors a link to /dev/zero", base, link("model.safetensors", "/dev/zero"),
                match="points outside")
    folder_case("folder: model.safetensors a FIFO", base, fifo("model.safetensors"), match="not a regular file",
                fast=True)
    folder_case("folder: config.json a FIFO", base, fifo("config.json"), match="not a regular file", fast=True)
    folder_case("folder: vocab.txt a FIFO", base, fifo("vocab.txt"), expect="loads", fallback_tokenizer=True,
                match="not a regular file")
    folder_case("folder: generation_config.json a FIFO", base, fifo("generation_config.json"), expect="loads",
                match="generation_config.json is not a regular file")
    folder_case("folder: a FIFO the model does not need (README.md)", base, fifo("README.md"), expect="loads")
    folder_case("folder: a shard a link into the uploads", sharded,
                link(shard_names[0], root / "tmp" / f"attnviz-uploads-{os.getuid()}" / "attnviz-upload-x" / "m"
                     / shard_names[0]), rooted=False, match="into the uploads")
    folder_case("folder: index by absolute path, on a server without a root", pointing(
        str(secret / "secret.safetensors"), True), rooted=False, match="cannot be a shard")
    folder_case("folder: a typed path with a NUL byte", base, typed=str(models / "x\x00y"), match="control")
    folder_case("folder: links to blobs inside the root (Hugging Face's cache)", {},
                lambda folder: _cache_layout(folder, base), expect="loads")
    facts = {"secret": str(secret), "marker": str(marker), "small": str(tiny), "sentinel_value": SENTINEL_VALUE,
             "sentinel_token": SENTINEL_TOKEN, "tmp": str(root / "tmp")}
    (root / "tmp").mkdir()
    _plant_upload(root / "tmp", tiny, shard_names[0], sharded)
    return cases, facts


def _sentencepiece(pieces: list[str]) -> bytes:
    """A sentencepiece BPE model (protobuf, written by hand: field 1 repeated pieces {1: piece, 2: score, 3: type},
    field 2 trainer_spec {3: model_type = BPE})."""
    def varint(value: int) -> bytes:
        out = bytearray()
        while True:
            out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
            value >>= 7
            if not value:
                return bytes(out)

    def field(number: int, payload: bytes) -> bytes:
        return varint(number << 3 | 2) + varint(len(payload)) + payload

    def piece(text: str, kind: int) -> bytes:
        return field(1, text.encode()) + varint(2 << 3 | 5) + struct.pack("<f", -1.0) + varint(3 << 3) + varint(kind)

    specials = [piece("<unk>", 2), piece("<s>", 3), piece("</s>", 3), piece("a", 1), piece("b", 1)]
    return (b"".join(field(1, p) for p in specials) + b"".join(field(1, piece(p, 1)) for p in pieces)
            + field(2, varint(3 << 3) + varint(2)))


def _tiny_gpt_neo(folder: Path, max_position_embeddings: int) -> Path:
    """A tiny GPT-Neo whose config and position table say ``max_position_embeddings`` (built small, then the
    table and config grown on disk: building it at that size takes the very time and memory the case is about)."""
    from safetensors.torch import load_file, save_file

    from attnviz.bench.tiny import make_tiny_checkpoint

    make_tiny_checkpoint("gpt_neo", folder)
    weights = load_file(folder / "model.safetensors")
    name = next(n for n in weights if n.endswith("wpe.weight"))
    weights[name] = torch.randn(max_position_embeddings, weights[name].shape[1])
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": max_position_embeddings}))
    return folder


def _tiny_seq2seq(folder: Path) -> Path:
    from attnviz.bench.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint("t5", folder, seq2seq_lm=True)


def _tiny_masked_lm(folder: Path, head: bool = True) -> Path:
    from attnviz.bench.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint("bert", folder, masked_lm=head)


def _cache_layout(folder: Path, files: dict[str, bytes]) -> None:
    """A snapshot folder of links into a blobs folder beside it, as huggingface_hub's cache lays files out."""
    blobs = folder.parent / f"{folder.name}-blobs"
    blobs.mkdir()
    for index, (name, data) in enumerate(files.items()):
        (blobs / f"blob{index}").write_bytes(data)
        os.symlink(blobs / f"blob{index}", folder / name)


def _plant_upload(temporary: Path, tiny: Path, shard: str, sharded: dict[str, bytes]) -> None:
    """Another browser's upload, where the runner's uploads root will be (so a link can point into it)."""
    folder = temporary / f"attnviz-uploads-{os.getuid()}" / "attnviz-upload-x" / "m"
    folder.mkdir(parents=True)
    os.chmod(folder.parent.parent, 0o700)
    (folder / shard).write_bytes(sharded[shard])


def write_plan(root: Path, tiny: Path) -> Path:
    cases, facts = build_all(root, tiny)
    plan = root / "plan.json"
    plan.write_text(json.dumps({"cases": [asdict(c) for c in cases], "facts": facts}))
    return plan

