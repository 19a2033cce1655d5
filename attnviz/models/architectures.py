"""What attnviz knows about each model type, one :class:`Architecture` record per type, in :data:`ARCHITECTURES`.

A record says what the model is (encoder, decoder, encoder-decoder or vision), how it encodes positions and where
its position table is, how attnviz observes its attention (transformers' attention interface, hooks with their
adapter, or eager weights only, and why), and, for image models, its vision tower and prefix tokens. Loading,
capture, the vision and position pages ask these records; adding an architecture is one record here plus its
test. Types without a record load too when transformers builds them: their facts come from transformers' own
tables and naming conventions (:func:`architecture_of`; :func:`attnviz.models.position_tables.position_table`, where
a checkpoint keeps its absolute position table).

The listed records are the types attnviz's tests load from tiny random checkpoints and check against
transformers' own eager attention weights: the Checkpoints page and the README show that list (a test keeps the
README in step, and the tests are parametrised by :data:`TESTED_MODEL_TYPES` and :data:`TESTED_VISION_TYPES`).
"""

from __future__ import annotations

import functools
import importlib
import sys
from dataclasses import dataclass

import torch

from attnviz.models.adapters import Adapter, BloomAdapter, GPTNeoAdapter, MPNetAdapter

ROLES = ("encoder", "decoder", "encoder-decoder", "vision")
# How a type encodes positions: an absolute table (trained, or sinusoidal and fixed), a rotation of Q and K, a
# per-head linear bias (ALiBi), relative terms added to the scores (T5's bias, DeBERTa's disentangled terms), or both
POSITION_SCHEMES = ("learned", "sinusoidal", "rotary", "ALiBi", "relative", "learned + relative")
# transformers' names of a decoder layer's cross-attention module (BART-likes, T5-likes, BERT as a decoder),
# matched in lower case anywhere in the module's name
CROSS_ATTENTION_NAMES = ("encoder_attn", "encdecattention", "crossattention")


@dataclass(frozen=True)
class Architecture:
    """Everything attnviz needs to know about one ``model_type`` that transformers' config does not say."""

    model_type: str
    role: str  # one of ROLES; "vision": an image encoder (patches in, read as tokens)
    traits: str = ""  # what sets it apart, in the supported list: "ALiBi", "shared layers"
    positions: str = "learned"  # one of POSITION_SCHEMES
    # The parameter holding its absolute position table, when it has one: [rows, d], or [1, rows, d] (ViT)
    position_table: str | None = None
    position_rows_skipped: int = 0  # rows of that table before position 0 (BART's and OPT's offset of 2)
    # RoBERTa-likes: position ids start at padding_idx + 1 (the table's padding_idx, else the config's pad_token_id)
    positions_after_padding: bool = False
    sinusoidal_flag: str | None = None  # a config flag that makes a "learned" table fixed sinusoids (DistilBERT's)
    adapter: Adapter | None = None  # attention in its own code, read by hooks through this adapter
    weights_only_reason: str | None = None  # attention in its own code that no hook can read: why
    cross_attention: tuple[str, ...] = CROSS_ATTENTION_NAMES  # encoder-decoder: its cross-attention module's name
    vision_tower: str | None = None  # an image-text checkpoint: the transformers class of its vision tower
    image_prefix: tuple[str, ...] = ("[CLS]",)  # vision: the tokens before the patches
    shared_layers: bool = False  # one set of layer weights serves every layer (ALBERT)
    listed: bool = True  # on the tested list: loaded from a tiny checkpoint and checked by the tests

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"{self.model_type}: role must be one of {ROLES}, got {self.role!r}")
        if self.positions not in POSITION_SCHEMES:
            raise ValueError(f"{self.model_type}: positions must be one of {POSITION_SCHEMES}, got {self.positions!r}")
        if self.adapter is not None and self.weights_only_reason is not None:
            raise ValueError(f"{self.model_type}: an adapter (hooks) and a weights-only reason exclude each other")

    @property
    def capture_path(self) -> str:
        """How its attention is observed: "interface", "hooks" or "weights" (see :mod:`attnviz.models.eager`), with
        the installed transformers: a type whose code moves to the attention interface is recorded there, as
        :func:`capture_path_of` finds on the loaded model (Falcon did in transformers 5.25)."""
        if (self.adapter is not None or self.weights_only_reason is not None) and code_uses_interface(self.model_type):
            return "interface"
        if self.adapter is not None:
            return "hooks"
        return "weights" if self.weights_only_reason is not None else "interface"

    @property
    def summary(self) -> str:
        """Its role and traits, as the supported list shows them: "encoder, shared layers"."""
        role = "image encoder" if self.role == "vision" else self.role
        return f"{role}, {self.traits}" if self.traits else role


_ROBERTA = dict(role="encoder", position_table="embeddings.position_embeddings.weight", positions_after_padding=True)
_BERT_LIKE = dict(role="encoder", position_table="embeddings.position_embeddings.weight")
_BART_LIKE = dict(role="encoder-decoder", position_table="encoder.embed_positions.weight", position_rows_skipped=2,
                  cross_attention=("encoder_attn",))
_ROTARY_DECODER = dict(role="decoder", positions="rotary")
# Vision: a learned table with one row per token the model makes of an image at its configured size: the prefix
# tokens' rows ([CLS], DeiT's [DIST]), then one per patch in reading order; ViT-likes keep it as [1, rows, d]
_VISION = dict(role="vision", position_table="embeddings.position_embeddings")
_VISION_EMBEDDING = dict(role="vision", position_table="embeddings.position_embedding.weight")  # CLIP, SigLIP

RECORDS = (
    # Text models, in the order the supported list shows them
    Architecture("bert", **_BERT_LIKE),
    Architecture("roberta", **_ROBERTA),
    Architecture("xlm-roberta", **_ROBERTA),
    Architecture("distilbert", sinusoidal_flag="sinusoidal_pos_embds", **_BERT_LIKE),
    Architecture("albert", traits="shared layers", shared_layers=True, **_BERT_LIKE),
    Architecture("electra", **_BERT_LIKE),
    Architecture("deberta-v2", traits="disentangled attention", positions="learned + relative", **_BERT_LIKE,
                 weights_only_reason="DeBERTa adds disentangled content-to-position and position-to-content terms, "
                                     "computed inside its own attention code from relative position embeddings, which "
                                     "no hook can read"),
    Architecture("mpnet", traits="relative position bias", positions="learned + relative", adapter=MPNetAdapter(),
                 positions_after_padding=True, **_BERT_LIKE),  # its code fixes padding_idx at 1
    Architecture("gpt2", role="decoder", position_table="wpe.weight"),
    Architecture("gpt_neo", role="decoder", traits="local and global layers", position_table="wpe.weight",
                 adapter=GPTNeoAdapter()),
    Architecture("gpt_neox", **_ROTARY_DECODER),
    Architecture("gptj", **_ROTARY_DECODER),
    Architecture("opt", role="decoder", position_table="decoder.embed_positions.weight", position_rows_skipped=2),
    Architecture("bloom", role="decoder", traits="ALiBi", positions="ALiBi", adapter=BloomAdapter()),
    Architecture("falcon", **_ROTARY_DECODER,
                 weights_only_reason="Falcon applies its rotary embedding (or ALiBi) to Q and K inside its own "
                                     "attention code, after the projections a hook can read (before transformers "
                                     "5.25; since, it goes through the attention interface)"),
    Architecture("mpt", role="decoder", traits="ALiBi", positions="ALiBi",
                 weights_only_reason="MPT adds its ALiBi bias to the scores inside its own attention code, after "
                                     "the projections a hook can read"),
    Architecture("llama", traits="grouped-query attention", **_ROTARY_DECODER),
    Architecture("mistral", traits="sliding window", **_ROTARY_DECODER),
    Architecture("mixtral", traits="mixture of experts", **_ROTARY_DECODER),
    Architecture("qwen2", **_ROTARY_DECODER),
    Architecture("qwen3", **_ROTARY_DECODER),
    Architecture("gemma", **_ROTARY_DECODER),
    Architecture("gemma2", traits="logit soft-capping and sliding window", **_ROTARY_DECODER),
    Architecture("gemma3_text", **_ROTARY_DECODER),
    Architecture("phi", traits="partial rotary", **_ROTARY_DECODER),
    Architecture("phi3", **_ROTARY_DECODER),
    Architecture("stablelm", **_ROTARY_DECODER),
    Architecture("olmo", **_ROTARY_DECODER),
    Architecture("starcoder2", **_ROTARY_DECODER),
    Architecture("gpt_oss", traits="attention sinks", **_ROTARY_DECODER),
    Architecture("t5", role="encoder-decoder", traits="relative position bias", positions="relative",
                 cross_attention=("encdecattention",)),
    Architecture("bart", **_BART_LIKE),
    Architecture("mbart", **_BART_LIKE),
    # Marian's and Pegasus's tables are fixed sinusoids (never trained) and start at position 0: no offset rows
    Architecture("marian", **dict(_BART_LIKE, positions="sinusoidal", position_rows_skipped=0)),
    Architecture("pegasus", **dict(_BART_LIKE, positions="sinusoidal", position_rows_skipped=0)),
    # Vision transformers (images in, patches as tokens): tests/test_vision.py loads each the same way
    Architecture("vit", **_VISION),
    Architecture("deit", traits="distillation token", image_prefix=("[CLS]", "[DIST]"), **_VISION),
    Architecture("dinov2", **_VISION),
    Architecture("clip_vision_model", **_VISION_EMBEDDING),
    Architecture("siglip_vision_model", traits="no [CLS]", image_prefix=(), **_VISION_EMBEDDING),
    # Known, not on the tested list
    Architecture("clip", vision_tower="CLIPVisionModel", listed=False, **_VISION_EMBEDDING),  # image-text: its tower
    Architecture("siglip", vision_tower="SiglipVisionModel", image_prefix=(), listed=False, **_VISION_EMBEDDING),
    # Built by transformers as causal LMs, yet bidirectional by default: encoders
    Architecture("xlnet", role="encoder", positions="relative", listed=False),
    Architecture("bert-generation", listed=False, **_BERT_LIKE),
    # Position ids after the padding index, as RoBERTa's
    *(Architecture(name, listed=False, **_ROBERTA) for name in (
        "camembert", "longformer", "data2vec-text", "roberta-prelayernorm", "xmod", "ibert", "markuplm")),
)
ARCHITECTURES: dict[str, Architecture] = {record.model_type: record for record in RECORDS}

TESTED_MODEL_TYPES = {r.model_type: r.summary for r in RECORDS if r.listed and r.role != "vision"}
TESTED_VISION_TYPES = {r.model_type: r.summary for r in RECORDS if r.listed and r.role == "vision"}


def path_of(model_type: str) -> str:
    """How a recorded type is observed: "interface", "hooks" or "weights" (see :mod:`attnviz.models.eager`)."""
    return ARCHITECTURES[model_type].capture_path


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


# ---------------------------------------------------------------------------------------------------------------
# Role: encoder, decoder or encoder-decoder; and whether it reads images


def architecture_of(model_type: str, *, is_encoder_decoder: bool = False, is_decoder: bool = False) -> str:
    """"encoder", "decoder" or "encoder-decoder": the config's flags first, then the record, and for a type
    without one, transformers' tables (a type it builds as a causal LM and never as a masked LM is a decoder)."""
    if is_encoder_decoder:
        return "encoder-decoder"
    if is_decoder:
        return "decoder"
    record = ARCHITECTURES.get(model_type)
    if record is not None and record.role != "encoder-decoder":  # a seq2seq type is one only when its config says
        return "decoder" if record.role == "decoder" else "encoder"
    return "decoder" if _only_causal(model_type) else "encoder"


def _only_causal(model_type: str) -> bool:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def reads_token_types(model) -> bool:
    """Whether ``model`` reads ``token_type_ids`` as segments: its forward takes them and it has a token-type table
    (``type_vocab_size`` > 0: BERT, ALBERT, ELECTRA...) or is not a decoder (XLNet's segments). A decoder without
    such a table does not: GPT-2, GPT-J, GPT-Neo and CodeGen accept them but look them up in their word
    embeddings, so a mismatched tokenizer's token types (a BERT tokenizer's zeros) would add the embedding of
    token 0 to every position and change every weight."""
    import inspect

    if "token_type_ids" not in inspect.signature(model.forward).parameters:
        return False
    config = model.config
    size = getattr(config, "type_vocab_size", None)
    if isinstance(size, int) and size > 0:
        return True
    return architecture_of(config.model_type, is_encoder_decoder=bool(getattr(config, "is_encoder_decoder", False)),
                           is_decoder=bool(getattr(config, "is_decoder", False))) != "decoder"


def model_inputs(model, encoded) -> dict:
    """What ``model`` reads of a tokenizer's output ``encoded``: the names its forward takes, and ``token_type_ids``
    only where it reads them as segments (:func:`reads_token_types`)."""
    import inspect

    accepted = set(inspect.signature(model.forward).parameters)
    if not reads_token_types(model):
        accepted.discard("token_type_ids")
    return {name: value for name, value in encoded.items() if name in accepted}


def reads_images(model_type: str) -> bool:
    """Whether attnviz reads this type as a vision transformer (an image encoder, or an image-text checkpoint's
    vision tower)."""
    record = ARCHITECTURES.get(model_type)
    return record is not None and record.role == "vision"


def vision_tower(model_type: str) -> str | None:
    """The transformers class attnviz loads an image-text checkpoint of this type as (its vision tower), or None."""
    record = ARCHITECTURES.get(model_type)
    return None if record is None else record.vision_tower


def image_prefix(model_type: str) -> tuple[str, ...]:
    """The names of the tokens a vision transformer puts before its patches ("[CLS]"; DeiT's "[DIST]" too)."""
    record = ARCHITECTURES.get(model_type)
    return ("[CLS]",) if record is None else record.image_prefix


def positions_after_padding(model_type: str) -> bool:
    record = ARCHITECTURES.get(model_type)
    return record is not None and record.positions_after_padding


def shares_layers(model_type: str) -> bool:
    record = ARCHITECTURES.get(model_type)
    return record is not None and record.shared_layers


# ---------------------------------------------------------------------------------------------------------------
# Capture: which path, its adapter, and which attention a recorded call belongs to


def declared_positions(config) -> int | None:
    """The length a config gives its positions: its position table's rows (``max_position_embeddings``, GPT-2's
    ``n_positions``) or MPT's ``max_seq_len`` (the length its ALiBi bias is built for); None when it names none
    (BLOOM)."""
    for name in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = getattr(config, name, None)
        if value:
            return int(value)
    return None


@functools.cache
def code_uses_interface(model_type: str) -> bool:
    """Whether the installed transformers' modeling code of ``model_type`` goes through its attention interface
    (the test :func:`uses_attention_interface` makes on a loaded model, made on the module by its name)."""
    name = model_type.replace("-", "_")
    try:
        module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    except ImportError:
        return False
    return hasattr(module, "ALL_ATTENTION_FUNCTIONS")


def uses_attention_interface(model: torch.nn.Module) -> bool:
    """True when the model's attention goes through transformers' attention interface, which attnviz records."""
    for module in model.modules():
        source = sys.modules.get(type(module).__module__)
        if source is not None and hasattr(source, "ALL_ATTENTION_FUNCTIONS"):
            return True
    return False


def capture_path_of(model: torch.nn.Module, model_type: str) -> str:
    """"interface" when the model's attention goes through transformers' attention interface (recorded and
    replayed); else "hooks" when its record names an adapter that knows where the model's own attention code keeps
    Q, K and its score terms, or "weights" (transformers' eager ``output_attentions`` weights, as bertviz shows
    them)."""
    if uses_attention_interface(model):
        return "interface"
    return "hooks" if adapter_of(model_type) is not None else "weights"


def adapter_of(model_type: str) -> Adapter | None:
    record = ARCHITECTURES.get(model_type)
    return None if record is None else record.adapter


def capture_note(model_type: str, path: str) -> str | None:
    """One paragraph for the pages: which path a model took and what it allows; None for the interface path."""
    if path == "interface":
        return None
    record = ARCHITECTURES.get(model_type)
    if path == "hooks":
        return (f"{model_type} computes attention in its own code, not through transformers' attention interface: "
                f"attnviz reads its Q, K, V and score terms with hooks ({record.adapter.note}), so replay, "
                "the Q.K view and the what-if work; the replay check compares with the model's own eager weights. "
                f"Inputs are capped at a length where every layer's weights fit at once.")
    reason = (record.weights_only_reason if record is not None and record.weights_only_reason
              else "it computes attention in its own code")
    return (f"{model_type} does not route attention through transformers' attention interface, and {reason}. "
            "attnviz shows transformers' own eager attention weights (output_attentions, as bertviz does): every "
            "head view works, but replay, the Q.K view, the what-if and the scaling and position experiments on "
            "this model are not available. Inputs are capped at a length where every layer's weights fit at once.")


def attention_kind(module_name: str, model_type: str, encoder_decoder: bool) -> str:
    """Which attention a recorded call of the module ``module_name`` belongs to: "self" in an encoder or a
    decoder alone; in an encoder-decoder "encoder", "decoder" or "cross" (the record's cross-attention name)."""
    if not encoder_decoder:
        return "self"
    record = ARCHITECTURES.get(model_type)
    cross_names = CROSS_ATTENTION_NAMES if record is None else record.cross_attention
    lowered = module_name.lower()
    if any(name in lowered for name in cross_names):
        return "cross"
    return "encoder" if lowered.startswith("encoder") or ".encoder." in lowered else "decoder"
