"""Tiny checkpoints made locally with save_pretrained (no downloads), with the bundled BERT's tokenizer files: for
the tests and the browser benchmarks."""

import shutil
import zipfile
from pathlib import Path

import torch

from attnviz.models.architectures import TESTED_VISION_TYPES
from attnviz.models.shipped import default_model_dir

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"]
VOCAB = 30522  # the bundled tokenizer's vocabulary


def tiny_config(kind: str):
    from transformers import BartConfig, BertConfig, DistilBertConfig, GPT2Config, LlamaConfig, RobertaConfig, T5Config

    if kind == "gpt2":
        return GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    if kind == "llama":  # grouped-query attention: 4 query heads share 2 K/V heads
        return LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64,
        )
    if kind == "bart":
        return BartConfig(
            vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        )
    if kind == "t5":
        return T5Config(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
            decoder_start_token_id=0,
        )
    if kind == "distilbert":
        return DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                max_position_embeddings=64)
    if kind == "roberta":
        return RobertaConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=66, pad_token_id=0,
        )
    if kind == "bert":
        return BertConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64,
        )
    return _any_tiny_config(kind)


# Sizes shared by every other type's tiny config: 2 layers, 4 heads (2 K/V heads where the type has GQA), d 32
_COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=64)
_GQA = {"mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "stablelm", "olmo",
        "starcoder2"}
_SEQ2SEQ = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                decoder_start_token_id=2, pad_token_id=1)
_SPECIAL = {
    "albert": dict(_COMMON, embedding_size=16),
    "xlm-roberta": dict(_COMMON, max_position_embeddings=66, pad_token_id=1),
    "mpnet": dict(_COMMON, max_position_embeddings=66, pad_token_id=1),
    "gpt_neo": dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                    attention_types=[[["global", "local"], 1]], window_size=4, max_position_embeddings=64),
    "gptj": dict(_COMMON, rotary_dim=4),
    "opt": dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                max_position_embeddings=64, word_embed_proj_dim=32),
    "bloom": dict(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4),
    "falcon": dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
    "mpt": dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, expansion_ratio=2, max_seq_len=64),
    "phi": dict(_COMMON, partial_rotary_factor=0.5),
    "phi3": dict(_COMMON, num_key_value_heads=2, pad_token_id=0),
    "mixtral": dict(_COMMON, num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1),
    "gpt_oss": dict(_COMMON, num_key_value_heads=2, head_dim=8, intermediate_size=32, num_local_experts=2,
                    num_experts_per_tok=1, sliding_window=4),
    "mbart": _SEQ2SEQ, "marian": _SEQ2SEQ, "pegasus": _SEQ2SEQ,
}


def _any_tiny_config(kind: str):
    """A 2-layer, 4-head, d 32 config of any model type transformers builds (the architecture tests' list)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if kind not in CONFIG_MAPPING:
        raise ValueError(kind)
    kwargs = dict(_SPECIAL.get(kind, _COMMON))
    if kind in _GQA:
        kwargs.setdefault("num_key_value_heads", 2)
    if kind in ("gemma", "gemma2", "gemma3_text", "qwen3"):
        kwargs["head_dim"] = 8
    return AutoConfig.for_model(kind, **kwargs)


def copy_tokenizer(folder: Path) -> None:
    """The bundled BERT's tokenizer files into ``folder``."""
    for name in TOKENIZER_FILES:
        source = default_model_dir() / name
        if source.exists():
            shutil.copy(source, folder / name)


def make_tiny_checkpoint(kind: str, folder: Path, *, with_tokenizer: bool = True, seed: int = 0,
                         seq2seq_lm: bool = False, masked_lm: bool = False, config=None) -> Path:
    """A random tiny ``kind`` (or ``config``) saved with save_pretrained; ``seq2seq_lm``: with its LM head (an
    encoder-decoder that generates); ``masked_lm``: an encoder with its masked-LM head."""
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    torch.manual_seed(seed)
    builder = AutoModelForSeq2SeqLM if seq2seq_lm else AutoModelForMaskedLM if masked_lm else AutoModel
    model = builder.from_config(config or tiny_config(kind))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    if with_tokenizer:
        copy_tokenizer(folder)
    return folder


def zip_folder(folder: Path, zip_path: Path, prefix: str = "") -> Path:
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, prefix + str(path.relative_to(folder)))
    return zip_path


VISION_KINDS = tuple(TESTED_VISION_TYPES)


def tiny_vision_config(kind: str, image_size: int = 32, patch_size: int = 8):
    """A 2-layer, 4-head, d 32 vision transformer reading ``image_size`` squares in ``patch_size`` patches."""
    from transformers import AutoConfig

    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=image_size,
                 patch_size=patch_size)
    if kind == "dinov2":
        return AutoConfig.for_model(kind, mlp_ratio=2, **sizes)
    return AutoConfig.for_model(kind, intermediate_size=64, **sizes)


def make_tiny_vision_checkpoint(kind: str, folder: Path, *, with_processor: bool = True, seed: int = 0,
                                image_size: int = 32) -> Path:
    """A random tiny vision transformer saved with save_pretrained, with a ViT image processor for its size."""
    from transformers import AutoModel, ViTImageProcessor

    torch.manual_seed(seed)
    model = AutoModel.from_config(tiny_vision_config(kind, image_size))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    if with_processor:
        ViTImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(folder)
    return folder
