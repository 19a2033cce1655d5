"""The tests' tiny checkpoints: made by attnviz.bench.tiny, shared with the browser benchmarks."""

from attnviz.bench.tiny import TOKENIZER_FILES, VOCAB, make_tiny_checkpoint, tiny_config, zip_folder

__all__ = ["TOKENIZER_FILES", "VOCAB", "make_tiny_checkpoint", "tiny_config", "zip_folder"]
