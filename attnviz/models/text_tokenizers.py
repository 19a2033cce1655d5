"""A model's text tokenizer: the checkpoint's own (read from the view of its checked files) when it fits the
model, else a marked stand-in that splits words and says why."""

from __future__ import annotations

import zlib
from pathlib import Path

from attnviz.checkpoints import preflight
from attnviz.checkpoints.safety import first_line

# Files that carry a vocabulary; without one, transformers 5 builds an empty tokenizer instead of failing.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "tokenizer.model",
                   "sentencepiece.bpe.model")
TEST_SENTENCE = "Attention is all you need."  # what a tokenizer and a model are tried on at load


class FallbackTokenizer:
    """Used only when a checkpoint comes without tokenizer files. Its ids are NOT the model's vocabulary:
    attention patterns from it show mechanics, not what the model learned about words."""

    def __init__(self, kind: str, vocab_size: int):
        if kind not in ("whitespace", "bytes"):
            raise ValueError(f"fallback tokenizer must be 'whitespace' or 'bytes', got {kind!r}")
        self.kind = kind
        self.vocab_size = max(int(vocab_size), 1)

    def tokenize(self, text: str) -> list[str]:
        if self.kind == "whitespace":
            return text.split()
        return [chr(b) if 32 <= b < 127 else f"<0x{b:02X}>" for b in text.encode("utf-8")]

    def ids(self, tokens: list[str], text: str) -> list[int]:
        if self.kind == "bytes":
            return [b % self.vocab_size for b in text.encode("utf-8")]
        return [zlib.crc32(t.encode("utf-8")) % self.vocab_size for t in tokens]


def load_tokenizer(checked: preflight.CheckedFolder, view: Path, config) -> tuple[object, str | None]:
    """The folder's own tokenizer (read from the view of its checked files), or a marked stand-in when it has
    none or it cannot be used: ``(tokenizer, note for the page)``."""
    problem = checked.tokenizer_problem or "This checkpoint has no tokenizer files"
    if checked.tokenizer_problem is None and any(checked.has(name) for name in TOKENIZER_FILES):
        try:
            tokenizer = tokenizer_of(view)
            problem = tokenizer_problem(tokenizer, int(getattr(config, "vocab_size", 0) or 0))
            if problem is None:
                return tokenizer, None
        except Exception as failure:  # noqa: BLE001 - any failure means: no usable tokenizer in this folder
            problem = f"Its tokenizer files could not be read ({first_line(failure, 120)})"
    note = (
        f"{problem}, so words are split on whitespace and mapped to arbitrary ids. The attention shows the model's "
        "mechanics, not what it learned about these words."
    )
    return FallbackTokenizer("whitespace", getattr(config, "vocab_size", 1)), note


def tokenizer_problem(tokenizer, vocab_size: int) -> str | None:
    """Why a tokenizer that loaded cannot be used with this model (None if it can): it must give tokens for a
    test sentence, with ids the model's embeddings have."""
    if len(tokenizer) == 0:
        return "Its tokenizer files hold no vocabulary"
    largest = max(tokenizer.get_vocab().values(), default=0)
    if vocab_size and largest >= vocab_size:
        return (f"Its tokenizer has token ids up to {largest:,}, but the model's vocabulary has {vocab_size:,} "
                "entries")
    ids = tokenizer(TEST_SENTENCE)["input_ids"]
    if not ids:
        return "Its tokenizer gives no tokens for a test sentence (its files do not fit together)"
    if vocab_size and max(ids) >= vocab_size:
        return (f"Its tokenizer gives token ids up to {max(ids):,}, but the model's vocabulary has {vocab_size:,} "
                "entries")
    return None


def tokenizer_of(view: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(view, local_files_only=True, trust_remote_code=False)
