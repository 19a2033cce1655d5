"""What a loaded model is tried on before any page shows it: one forward pass on a test sentence (or a grey
image, through its processor), and the token ids its generation config forces or suppresses."""

from __future__ import annotations

import torch

from attnviz.checkpoints.checked_files import shown
from attnviz.checkpoints.safety import CheckpointRefused, first_line
from attnviz.core import vision
from attnviz.models import architectures
from attnviz.models.text_tokenizers import TEST_SENTENCE, FallbackTokenizer


def _test_inputs(bundle) -> dict:
    """A short sentence (or a grey image) as the model's inputs, for :func:`check_it_runs`."""
    model = bundle.model
    device = next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))
    if bundle.modality == "image":  # through the processor, as every image goes (it was checked at load)
        pixels = vision.pixel_values(bundle.image_processor, vision.test_image())
        return {"pixel_values": pixels.to(device=device, dtype=next(model.parameters()).dtype)}
    if isinstance(bundle.tokenizer, FallbackTokenizer):
        tokens = bundle.tokenizer.tokenize(TEST_SENTENCE)
        inputs = {"input_ids": torch.tensor([bundle.tokenizer.ids(tokens, TEST_SENTENCE)])}
    else:
        inputs = dict(bundle.tokenizer(TEST_SENTENCE, return_tensors="pt"))
    if bundle.architecture == "encoder-decoder":
        inputs["decoder_input_ids"] = inputs["input_ids"]
    return {name: value.to(device) for name, value in architectures.model_inputs(model, inputs).items()}


def check_it_runs(bundle) -> None:
    """Run the loaded model once on a test sentence: a model that cannot run (a config transformers reads but its
    code cannot use) is refused here, with the reason, rather than on every page later; one whose outputs are
    NaN or infinite is kept and marked (``bundle.nonfinite_outputs``), so that every page can say so."""
    try:
        inputs = _test_inputs(bundle)
        with torch.no_grad():
            outputs = bundle.model(**inputs)
    except Exception as problem:  # noqa: BLE001 - whatever the model's code raises, the model cannot be shown
        raise CheckpointRefused(f"the model does not run on a test sentence ({type(problem).__name__}: "
                                f"{first_line(problem, 160)})") from None
    tensors = [value for value in (outputs.values() if hasattr(outputs, "values") else [outputs])
               if isinstance(value, torch.Tensor) and value.is_floating_point()]
    if any(not bool(torch.isfinite(t).all()) for t in tensors):
        bundle.nonfinite_outputs = f"its outputs on the test sentence “{TEST_SENTENCE}”"


GENERATION_IDS = ("forced_bos_token_id", "forced_eos_token_id", "decoder_start_token_id", "suppress_tokens",
                  "begin_suppress_tokens", "bad_words_ids")


def generation_ids_problem(model) -> str | None:
    """Why the token ids a model's generation config (or config) forces, suppresses or starts from cannot be
    used (None if they can): each must be a whole number among the model's output tokens; indexed, one past them
    raises deep in a generation step, and a negative one silently means another token."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    vocabulary = int(getattr(head, "out_features", 0) or getattr(model.config, "vocab_size", 0) or 0)
    for source, settings in (("generation_config.json", getattr(model, "generation_config", None)),
                             ("config.json", model.config)):
        for name in GENERATION_IDS:
            value = getattr(settings, name, None) if settings is not None else None
            ids = value if isinstance(value, (list, tuple)) else ([] if value is None else [value])
            flat = [i for item in ids for i in (item if isinstance(item, (list, tuple)) else [item])]
            bad = next((i for i in flat if isinstance(i, bool) or not isinstance(i, int)
                        or not 0 <= i < max(vocabulary, 1)), None)
            if flat and bad is not None:
                return (f"{source}: {name} names {shown(bad, 30)}, which is not a token of the model's "
                        f"vocabulary (0 to {vocabulary - 1:,})")
    return None
