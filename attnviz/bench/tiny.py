"""Tiny checkpoints made locally with save_pretrained (no downloads), with the bundled BERT's tokenizer files: for
the tests and the browser benchmarks."""

import shutil
import zipfile
from pathlib import Path

import torch

from attnviz.models.loading import default_model_dir

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
    raise ValueError(kind)


def make_tiny_checkpoint(kind: str, folder: Path, *, with_tokenizer: bool = True, seed: int = 0) -> Path:
    from transformers import AutoModel

    torch.manual_seed(seed)
    model = AutoModel.from_config(tiny_config(kind))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    if with_tokenizer:
        for name in TOKENIZER_FILES:
            source = default_model_dir() / name
            if source.exists():
                shutil.copy(source, folder / name)
    return folder


def zip_folder(folder: Path, zip_path: Path, prefix: str = "") -> Path:
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, prefix + str(path.relative_to(folder)))
    return zip_path
