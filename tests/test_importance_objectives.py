"""Head importance by each objective, against the model's own loss computed text by text on a copy of the model
whose head is zeroed at its output projection. An encoder saved with its masked-LM head loads with the head (refused
when its weights lack it), every ordinary token is masked once over a text's copies, and the maps, gradients and
token effects agree with transformers' own masked-LM loss; an encoder-decoder's map is the change of its own
sequence-to-sequence loss, the text as its own target."""

import copy
import json

import pytest
import torch

from attnviz.bench.tiny import make_tiny_checkpoint
from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.interventions import edits as iv
from attnviz.interventions import importance as imp
from attnviz.models.with_heads import declares_masked_lm_head, load_masked_lm
from tests.apptest_helpers import figure_titled, open_page

TEXTS = ["The cat sat on the mat.", "Attention heads read keys and values, then mix them."]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("masked")
    with_head = make_tiny_checkpoint("bert", root / "with-head", masked_lm=True)
    without = make_tiny_checkpoint("bert", root / "without-head")
    # says it has the head, and has not: the head's weights would be made up at random
    claims = make_tiny_checkpoint("bert", root / "claims-head")
    config = json.loads((claims / "config.json").read_text())
    (claims / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLM"]}))
    return {"with": with_head, "without": without, "claims": claims}


@pytest.fixture(scope="module")
def masked(folders):
    model, tokenizer = iv.editable_lm(folders["with"], masked=True)
    return model.double(), tokenizer


def test_only_a_checkpoint_holding_the_head_loads_with_it(folders):
    assert declares_masked_lm_head(folders["with"]) and not declares_masked_lm_head(folders["without"])
    model, _ = load_masked_lm(folders["with"])
    assert type(model).__name__ == "BertForMaskedLM"
    with pytest.raises(CheckpointRefused, match="no masked-LM head"):
        load_masked_lm(folders["claims"])


def test_every_ordinary_token_is_masked_once_over_the_copies(masked):
    _, tokenizer = masked
    batch = imp.batch_of(tokenizer, TEXTS, "masked")
    assert batch.copies == imp.MASK_EVERY and batch.real.shape[0] == 2 * imp.MASK_EVERY
    ids, labels = batch.inputs["input_ids"], batch.inputs["labels"]
    for text, sentence in enumerate(TEXTS):
        original = torch.tensor(tokenizer(sentence)["input_ids"])
        n = len(original)
        rows = slice(text, None, len(TEXTS))
        chosen = labels[rows, :n] >= 0  # [copies, n]
        assert chosen.sum(0).tolist() == [0] + [1] * (n - 2) + [0]  # CLS and SEP never; each other token once
        assert (ids[rows, :n][chosen] == tokenizer.mask_token_id).all()
        assert torch.equal(labels[rows, :n][chosen], original.repeat(imp.MASK_EVERY, 1)[chosen])
        assert torch.equal(ids[rows, :n][~chosen], original.repeat(imp.MASK_EVERY, 1)[~chosen])
    # as many copies whatever the batch holds: a text's loss never depends on the texts read with it
    assert imp.batch_of(tokenizer, TEXTS * 5, "masked").copies == imp.MASK_EVERY
    many = imp.batch_of(tokenizer, TEXTS * 32, "masked")
    assert many.copies == imp.MASK_EVERY and many.real.shape[0] == 64 * imp.MASK_EVERY
    assert [piece.stop - piece.start for piece in imp.pieces(many)] == [imp.MAX_ROWS] * imp.MASK_EVERY


TEN = [f"Sentence {word} number {i}: the {word} reads every token once, then again." for i, word in
       enumerate(["cat", "dog", "head", "key", "value", "query", "mat", "door", "layer", "token"])]


def test_a_chunked_masked_lm_map_gives_each_text_what_one_batch_gives(masked):
    """At the setting where it was false: ten texts in one batch (70 rows, run in two pieces) against chunks of two
    (their copies were 64 // texts: 6 against 7, and the values 30% apart)."""
    model, tokenizer = masked
    batch = imp.batch_of(tokenizer, TEN, "masked")
    together = {"zero": imp.ablation_map(model, batch, "zero"), "gradient": imp.gradient_importance(model, batch)}
    for method, whole in together.items():
        parts = []
        for start in range(0, len(TEN), 2):
            chunk = imp.batch_of(tokenizer, TEN[start:start + 2], "masked")
            parts.append((imp.ablation_map(model, chunk, "zero") if method == "zero" else
                          imp.gradient_importance(model, chunk)).per_text)
        torch.testing.assert_close(whole.per_text, torch.cat(parts, dim=-1), rtol=1e-9, atol=1e-12)
    # each text's loss is transformers' own, whatever the batch
    assert float(together["zero"].clean_per_text[3]) == pytest.approx(_reference_loss(model, tokenizer, TEN[3]),
                                                                      rel=1e-9)


def test_a_chunked_masked_lm_corpus_run_equals_one_chunk_of_every_document(masked, folders, tmp_path):
    from attnviz.corpus.documents import Corpus, Document
    from attnviz.corpus.importance import store as istore
    from attnviz.corpus.importance.runner import ImportanceSettings, run_importance

    corpus = Corpus("ten", [Document(text, f"line {i}") for i, text in enumerate(TEN)])
    found = {}
    for chunk in (2, 10):
        path = tmp_path / f"chunks-of-{chunk}.duckdb"
        run_importance(corpus, folders["with"], path, ImportanceSettings(max_docs=10, max_tokens=32, chunk_docs=chunk),
                       loaded=masked)
        with istore.ImportanceReader(path) as reader:
            found[chunk] = reader.connection.execute(
                "SELECT doc, method, module, head, value FROM head_effects ORDER BY ALL").fetchall()
    assert len(found[2]) == len(found[10]) == 10 * 3 * 2 * 4  # documents x measures x heads
    for a, b in zip(found[2], found[10], strict=True):
        assert a[:4] == b[:4] and a[4] == pytest.approx(b[4], rel=1e-9, abs=1e-12), a[:4]


def _reference_loss(model, tokenizer, sentence: str) -> float:
    """The text's masked-LM loss: each copy alone, transformers' own loss (mean over its masked tokens), weighted
    by how many tokens each copy masks."""
    batch = imp.batch_of(tokenizer, [sentence], "masked")
    total, count = 0.0, 0
    with torch.no_grad():
        for row in range(batch.copies):
            labels = batch.inputs["labels"][row : row + 1]
            masked = int((labels >= 0).sum())
            if masked:
                loss = model(input_ids=batch.inputs["input_ids"][row : row + 1], labels=labels).loss
                total, count = total + float(loss) * masked, count + masked
    return total / count


def test_the_zero_map_is_the_masked_lm_loss_change_of_each_text(masked):
    model, tokenizer = masked
    assert imp.objective_of(model) == "masked"
    result = imp.ablation_map(model, imp.batch_of(tokenizer, TEXTS, "masked"), "zero")
    assert result.objective == "masked" and result.per_text.shape == (2, 4, 2)
    for row, module in enumerate(result.modules):
        for head in (0, 3):
            reference = copy.deepcopy(model)
            dense = reference.get_submodule(module.name.rsplit(".", 1)[0]).output.dense
            width = dense.weight.shape[1] // module.heads
            with torch.no_grad():
                dense.weight[:, head * width: (head + 1) * width] = 0
            for text, sentence in enumerate(TEXTS):
                expected = _reference_loss(reference, tokenizer, sentence) - _reference_loss(model, tokenizer, sentence)
                assert float(result.per_text[row, head, text]) == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert result.clean == pytest.approx(sum(_reference_loss(model, tokenizer, s) for s in TEXTS) / 2, rel=1e-6)


def test_gradient_importance_shares_one_gate_over_a_texts_copies(masked):
    model, tokenizer = masked
    batch = imp.batch_of(tokenizer, TEXTS, "masked")
    result = imp.gradient_importance(model, batch)
    modules = result.modules
    for text, sentence in enumerate(TEXTS):
        alone = imp.batch_of(tokenizer, [sentence], "masked")
        gates = {module.name: torch.ones(module.heads, dtype=torch.float64, requires_grad=True)
                 for module in modules}  # one gate per head, for every copy
        with torch.enable_grad(), iv.gated(model, gates):
            outputs = model(input_ids=alone.inputs["input_ids"], attention_mask=alone.inputs["attention_mask"])
            labels = alone.inputs["labels"]
            loss = torch.nn.functional.cross_entropy(outputs.logits[labels >= 0], labels[labels >= 0])
            slopes = torch.autograd.grad(loss, [gates[module.name] for module in modules])
        for row, slope in enumerate(slopes):
            assert torch.allclose(result.per_text[row, :, text].double(), slope.abs(), rtol=1e-5, atol=1e-9)


def test_the_token_effect_lists_each_masked_token_once_in_text_order(masked):
    model, tokenizer = masked
    batch = imp.batch_of(tokenizer, TEXTS, "masked")
    result = imp.ablation_map(model, batch, "zero")
    targets, change = imp.token_effect(model, batch, result.modules[1], 2, text=1)
    assert targets == batch.tokens[1][1:-1]  # every token but CLS and SEP, in order
    assert float(change.mean()) == pytest.approx(float(result.per_text[1, 2, 1]), rel=1e-5, abs=1e-7)


def test_the_page_measures_an_uploaded_masked_lm_by_its_loss_and_says_when_the_head_is_missing(
        folders, clean_streamlit_caches):
    from attnviz.models.shipped import BUNDLED_GPT_DIR, BUNDLED_GPT_NAME, DEFAULT_MODEL_NAME

    models = {DEFAULT_MODEL_NAME: "unused", BUNDLED_GPT_NAME: str(BUNDLED_GPT_DIR),
              "tiny-mlm": str(folders["with"]), "claims-head": str(folders["claims"])}
    at = open_page("app_pages/importance.py", timeout=240, models=models, model="tiny-mlm", imp_view="Importance map")
    assert at.selectbox(key="imp_model").value == "tiny-mlm"  # an encoder with a loss is chosen as it is
    assert any(imp.OBJECTIVES["masked"] in c.value for c in at.caption)
    at.button(key="imp_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert figure_titled(at, "Gradient importance")["data"][0]["z"]  # a masked-LM loss has a gradient
    assert any("read in 7 copies" in c.value and "every ordinary token is predicted once" in c.value
               for c in at.caption)
    at.selectbox(key="imp_model").set_value("claims-head").run()
    assert not at.exception, [e.value for e in at.exception]
    caption = next(c.value for c in at.caption if "Measured by" in c.value)
    assert imp.OBJECTIVES["hidden"] in caption and "masked-LM head could not be used" in caption


@pytest.fixture(scope="module")
def seq2seq(tmp_path_factory):
    folder = make_tiny_checkpoint("t5", tmp_path_factory.mktemp("t5") / "t5", seq2seq_lm=True)
    model, tokenizer = iv.editable_lm(folder)
    return model.double(), tokenizer


def test_the_seq2seq_map_is_the_change_of_the_models_own_loss_text_by_text(seq2seq):
    """The text as its own target: each text alone, transformers' own ``labels`` loss, on a copy of the model whose
    head is zeroed at its output projection (encoder, decoder and cross-attention alike)."""
    model, tokenizer = seq2seq
    assert imp.objective_of(model) == "seq2seq"
    batch = imp.batch_of(tokenizer, TEXTS, "seq2seq")
    result = imp.ablation_map(model, batch, "zero")
    kinds = set()

    def loss(one, sentence: str) -> float:
        ids = torch.tensor([tokenizer(sentence)["input_ids"]])
        with torch.no_grad():
            return float(one(input_ids=ids, labels=ids).loss)

    for row, module in enumerate(result.modules):
        reference = copy.deepcopy(model)
        projection = reference.get_submodule(module.name.split("@")[0]).o
        width = projection.weight.shape[1] // module.heads
        with torch.no_grad():
            projection.weight[:, width: 2 * width] = 0  # head 1
        for text, sentence in enumerate(TEXTS):
            expected = loss(reference, sentence) - loss(model, sentence)
            assert float(result.per_text[row, 1, text]) == pytest.approx(expected, rel=1e-5, abs=1e-7), module.label
        kinds.add(module.kind)
    assert kinds == {"encoder", "decoder", "cross"}
