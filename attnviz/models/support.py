"""Which checkpoints attnviz reads: the model types its tests load from tiny random checkpoints and check
against transformers' own eager attention weights, and how each is observed. The Checkpoints page and the
README show this list (a test keeps the README in step, and the tests are parametrised by it)."""

from __future__ import annotations

from attnviz.models.eager import HOOKED_TYPES, WEIGHTS_ONLY_REASONS

# model_type -> what it stands for. tests/test_architectures.py loads every one (a tiny random checkpoint made in
# the test) and compares attnviz's weights with transformers' eager attention; tests/test_capture_modifiers.py
# adds windows, soft-capping and sinks.
TESTED_MODEL_TYPES = {
    "bert": "encoder",
    "roberta": "encoder",
    "xlm-roberta": "encoder",
    "distilbert": "encoder",
    "albert": "encoder, shared layers",
    "electra": "encoder",
    "deberta-v2": "encoder, disentangled attention",
    "mpnet": "encoder, relative position bias",
    "gpt2": "decoder",
    "gpt_neo": "decoder, local and global layers",
    "gpt_neox": "decoder",
    "gptj": "decoder",
    "opt": "decoder",
    "bloom": "decoder, ALiBi",
    "falcon": "decoder",
    "llama": "decoder, grouped-query attention",
    "mistral": "decoder, sliding window",
    "mixtral": "decoder, mixture of experts",
    "qwen2": "decoder",
    "qwen3": "decoder",
    "gemma": "decoder",
    "gemma2": "decoder, logit soft-capping and sliding window",
    "gemma3_text": "decoder",
    "phi": "decoder, partial rotary",
    "phi3": "decoder",
    "stablelm": "decoder",
    "olmo": "decoder",
    "starcoder2": "decoder",
    "gpt_oss": "decoder, attention sinks",
    "t5": "encoder-decoder, relative position bias",
    "bart": "encoder-decoder",
    "mbart": "encoder-decoder",
    "marian": "encoder-decoder",
    "pegasus": "encoder-decoder",
}


# Vision transformers (images in, patches as tokens): tests/test_vision.py loads each the same way
TESTED_VISION_TYPES = {
    "vit": "image encoder",
    "deit": "image encoder, distillation token",
    "dinov2": "image encoder",
    "clip_vision_model": "image encoder",
    "siglip_vision_model": "image encoder, no [CLS]",
}


def path_of(model_type: str) -> str:
    """How a tested type is observed: "interface", "hooks" or "weights" (see :mod:`attnviz.models.eager`)."""
    if model_type in HOOKED_TYPES:
        return "hooks"
    return "weights" if model_type in WEIGHTS_ONLY_REASONS else "interface"


def supported_markdown() -> str:
    """The tested types as Markdown bullets by path, for the Checkpoints page and the README."""
    groups = {
        "interface": "Recorded from transformers' attention interface and replayed exactly",
        "hooks": "Read by hooks from the model's own attention code and replayed exactly",
        "weights": "transformers' eager attention weights only (no replay, Q.K view or what-if)",
    }
    lines = []
    for path, title in groups.items():
        names = [f"`{name}` ({what})" for name, what in TESTED_MODEL_TYPES.items() if path_of(name) == path]
        lines.append(f"- {title}: {', '.join(names)}.")
    vision = [f"`{name}` ({what})" for name, what in TESTED_VISION_TYPES.items()]
    lines.append(f"- Vision transformers, recorded and replayed exactly, on an image: {', '.join(vision)}.")
    return "\n".join(lines)
