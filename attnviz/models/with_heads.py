"""Checkpoints loaded with the head that gives them a loss: a causal LM's (generation, and editing a decoder's
heads), an encoder-decoder's, and a masked LM's (head importance on an encoder saved with its MLM head). Checked
exactly as :func:`attnviz.models.loading.load_model_dir` checks a folder: safetensors only, nothing from the hub,
no code from the checkpoint, every file bounded."""

from __future__ import annotations

from pathlib import Path

from attnviz.checkpoints import preflight
from attnviz.checkpoints.safety import CheckpointRefused, first_line
from attnviz.checkpoints.uploads import link_rule_for
from attnviz.models import loading
from attnviz.models.text_tokenizers import TOKENIZER_FILES, tokenizer_of
from attnviz.models.trials import generation_ids_problem


def load_causal_lm(folder: str | Path):
    """The folder's causal LM (with its LM head), or its encoder-decoder LM (T5, BART, ...), and tokenizer, with
    eager attention so each step's weights come back (generation, and measuring the bundled GPT's heads);
    checked as :func:`load_model_dir` checks (safetensors only, nothing from the hub, no code from the
    checkpoint, every file bounded). Raises :class:`CheckpointRefused`, whatever goes wrong."""
    return _load_with_head(Path(folder), masked=False)


def load_masked_lm(folder: str | Path):
    """The folder's encoder with its masked-LM head (BERT's ``cls.predictions``, RoBERTa's ``lm_head``...) and
    tokenizer, checked as :func:`load_causal_lm`; refused when the checkpoint does not hold the head's weights
    (transformers would make them up at random) or its tokenizer has no mask token."""
    return _load_with_head(Path(folder), masked=True)


def declares_masked_lm_head(folder: str | Path) -> bool:
    """Whether the folder's config.json says it was saved with a masked-LM head (its ``architectures``)."""
    config = loading._config_of_folder(folder) or {}
    architectures = config.get("architectures")
    return isinstance(architectures, list) and any(
        isinstance(name, str) and name.endswith("ForMaskedLM") for name in architectures)


def _load_with_head(folder: Path, masked: bool):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    purpose = "predicting masked tokens" if masked else "generating text"
    view = None
    try:
        checked = preflight.inspect(folder, link_rule_for(folder))
        if checked.tokenizer_problem or not any(checked.has(name) for name in TOKENIZER_FILES):
            raise CheckpointRefused(f"{checked.tokenizer_problem or 'it has no tokenizer files'}: {purpose} "
                                    "needs the model's own tokenizer")
        view = preflight.make_view(checked)
        encoder_decoder = loading.architecture_of_config(checked.config) == "encoder-decoder"  # read once, checked
        loader = AutoModelForMaskedLM if masked else AutoModelForSeq2SeqLM if encoder_decoder else AutoModelForCausalLM
        loading._read_checked_config(checked, view, builder=loader)  # load_model_dir's size checks, with the head
        with loading.loading_lock():
            model, info = loader.from_pretrained(view, attn_implementation="eager", local_files_only=True,
                                                 use_safetensors=True, trust_remote_code=False,
                                                 output_loading_info=True)
        model.eval()
        if masked and info.get("missing_keys"):
            raise CheckpointRefused("its weights have no masked-LM head (missing: "
                                    f"{', '.join(sorted(info['missing_keys'])[:3])})")
        problem = None if masked else generation_ids_problem(model)
        if problem:
            raise CheckpointRefused(problem)
        tokenizer = tokenizer_of(view)
        if masked and getattr(tokenizer, "mask_token_id", None) is None:
            raise CheckpointRefused("its tokenizer has no mask token")
    except CheckpointRefused:
        if view is not None:
            preflight.remove_view(view)
        raise
    except Exception as problem:  # noqa: BLE001 - whatever transformers raises: this folder cannot do it
        if view is not None:
            preflight.remove_view(view)
        head = "masked-LM" if masked else "language-model"
        raise CheckpointRefused(f"it could not be loaded with its {head} head ({type(problem).__name__}: "
                                f"{first_line(problem, 160)})") from None
    preflight.keep_view_while(view, model)
    return model, tokenizer
