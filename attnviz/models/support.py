"""Which checkpoints attnviz reads: the model types its tests load from tiny random checkpoints and check
against transformers' own eager attention weights, and the limits it works within. The Checkpoints page and the
README show these lists (a test keeps the README in step)."""

from __future__ import annotations

# model_type -> what it stands for; each is tested in tests/test_models.py or tests/test_capture_modifiers.py
TESTED_MODEL_TYPES = {
    "bert": "encoder",
    "distilbert": "encoder",
    "roberta": "encoder",
    "gpt2": "decoder",
    "llama": "decoder, grouped-query attention",
    "mistral": "decoder, sliding window",
    "gemma2": "decoder, logit soft-capping and sliding window",
    "gpt_oss": "decoder, attention sinks",
    "bart": "encoder-decoder",
    "t5": "encoder-decoder, relative position bias",
}
# Refused with the reason: they do not route attention through transformers' attention interface.
NOT_SUPPORTED = ("deberta-v2", "mpnet", "gpt_neo", "bloom", "falcon")


def supported_markdown() -> str:
    """The tested types as one Markdown line, for the Checkpoints page and the README."""
    return ", ".join(f"`{name}` ({what})" for name, what in TESTED_MODEL_TYPES.items())
