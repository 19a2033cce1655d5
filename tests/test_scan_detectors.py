"""Head detectors in scans: on a corpus of repeated passages a scan names the bundled tiny GPT's induction heads as
such, with scores equal to a brute-force computation from transformers' eager weights; its scores relate to
TransformerLens's as stated; separators, special tokens and punctuation count what their names say; a decoder's
examples are not the first query's forced weight; a document too short to label is not labelled."""

import numpy as np
import pytest
import torch

from attnviz.core import analysis
from attnviz.corpus.documents import Corpus, Document, bundled_corpus
from attnviz.corpus.scan import store
from attnviz.corpus.scan.heads import CRITERIA, LABELS, SCAN_STATISTICS, document_partial
from attnviz.corpus.scan.runner import ScanSettings, run_scan
from attnviz.models.loading import load_model_dir
from attnviz.models.shipped import BUNDLED_GPT_DIR

MAX_TOKENS = 96


@pytest.fixture(scope="module")
def tiny_gpt():
    return load_model_dir(BUNDLED_GPT_DIR)


def repeated_passages(count: int = 12) -> list[str]:
    """Passages of the bundled corpus, each written twice in a row: the second copy's tokens repeat the first's."""
    texts = []
    for document in bundled_corpus().documents:
        words = document.text.split()[:20]
        if len(words) >= 10:
            passage = " ".join(words)
            texts.append(f"{passage} {passage}")
        if len(texts) == count:
            return texts
    raise AssertionError("the bundled corpus has too few passages")


@pytest.fixture(scope="module")
def repeated_scan(tiny_gpt, tmp_path_factory):
    texts = repeated_passages()
    path = tmp_path_factory.mktemp("detectors") / "repeated.duckdb"
    corpus = Corpus("repeated passages", [Document(text, f"passage {i}") for i, text in enumerate(texts)])
    run_scan(corpus, tiny_gpt, path, ScanSettings(max_docs=len(texts), max_tokens=MAX_TOKENS, chunk_docs=5))
    return path, texts


def eager_weights(bundle, text: str) -> tuple[list[int], np.ndarray]:
    """Token ids and ``[layers, heads, n, n]`` float64 weights from transformers' eager attention, run here."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(bundle.folder, attn_implementation="eager", local_files_only=True,
                                      use_safetensors=True).eval()
    encoded = bundle.tokenizer(text, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
    with torch.no_grad():
        attentions = model(input_ids=encoded["input_ids"], output_attentions=True).attentions
    return encoded["input_ids"][0].tolist(), torch.stack([a[0] for a in attentions]).double().numpy()


def brute_force_repeats(ids: list[int], weights: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per head, the sum over queries with a target of their weight on it, and the number of such queries; one
    query at a time, from the definitions (no special token in the tiny GPT's plain text)."""
    layers, heads, n, _ = weights.shape
    found = {name: (np.zeros((layers, heads)), np.zeros((layers, heads))) for name in ("duplicate", "induction")}
    for i in range(n):
        earlier = [j for j in range(i) if ids[j] == ids[i]]
        if not earlier:
            continue
        for name, keys in (("duplicate", earlier), ("induction", sorted({j + 1 for j in earlier}))):
            total, count = found[name]
            total += weights[:, :, i, keys].sum(-1)
            count += 1
    return found


def test_a_scan_of_repeated_passages_names_the_tiny_gpts_induction_heads(tiny_gpt, repeated_scan):
    path, texts = repeated_scan
    sums = {name: 0.0 for name in ("duplicate", "induction")}
    counts = dict(sums)
    for text in texts:
        ids, weights = eager_weights(tiny_gpt, text)
        for name, (total, count) in brute_force_repeats(ids, weights).items():
            sums[name] = sums[name] + total
            counts[name] = counts[name] + count
    with store.ScanReader(path) as reader:
        for name in ("duplicate", "induction"):
            mean, _ = reader.statistic_map(name)
            np.testing.assert_allclose(mean, sums[name] / counts[name], atol=3e-6, err_msg=name)
        induction, _ = reader.statistic_map("induction")
        labels = reader.top_labels()
    # the heads the brute force finds copying from after the earlier occurrence are labelled induction heads
    strong = {(int(layer), int(head)) for layer, head in zip(*np.nonzero(sums["induction"] / counts["induction"] > 0.5),
                                                             strict=True)}
    assert (2, 1) in strong  # the head the issue measured: 92% of second-copy queries' top weight after the copy
    for layer, head in strong:
        label, share = labels[(layer, head)]
        assert label == "induction head" and share > 0.8, (layer, head, label, share)
    # and no head that does not copy is called one
    for (layer, head), (label, _) in labels.items():
        if label == "induction head":
            assert induction[layer, head] >= analysis.LABEL_RULES["induction head"][1]


def test_the_detectors_relate_to_transformerlens_scores_as_stated(tiny_gpt):
    """TransformerLens's detect_head ("mul"): the weight on the detection pattern summed over every row, divided by
    the sum of all weights (the number of rows). Ours averages over the rows with a target: TL's = ours x share."""
    text = repeated_passages(1)[0]
    ids, weights = eager_weights(tiny_gpt, text)
    targets = analysis.repeat_targets(ids, [False] * len(ids))
    n = len(ids)
    # TransformerLens's induction pattern: its duplicate pattern (same token, strictly earlier) shifted one key right
    same = np.array([[ids[i] == ids[j] and j < i for j in range(n)] for i in range(n)])
    induction_tl = np.zeros_like(same)
    induction_tl[:, 1:] = same[:, :-1]
    np.testing.assert_array_equal(targets["duplicate"].numpy(), same)
    np.testing.assert_array_equal(targets["induction"].numpy(), np.tril(induction_tl))
    stats = analysis.head_statistics(torch.from_numpy(weights).float(), [str(i) for i in ids], [False] * n,
                                     allowed=torch.arange(1, n + 1).expand(weights.shape[0], n))
    with_target = same.any(1).sum()
    for s in stats:
        tl_score = (weights[s.layer, s.head] * induction_tl).sum() / weights[s.layer, s.head].sum()
        assert tl_score == pytest.approx(s.induction * with_target / n, abs=1e-5)
        assert tl_score < s.induction or s.induction == 0


def test_separators_special_and_punctuation_count_what_their_names_say(bert):
    """[UNK] (an emoji under BERT's vocabulary) is neither a separator nor a special token; [SEP] is both."""
    from attnviz.models.capture import capture

    result = capture(bert, "I love pizza 🍕 and sushi 🍣 # % & * / @ \\ _")
    tokens = result.tokens
    unknown = [i for i, t in enumerate(tokens) if t == "[UNK]"]
    sep = [i for i, t in enumerate(tokens) if t == "[SEP]"]
    assert unknown and sep
    separators = result.separators_of(tokens)
    assert [i for i, flag in enumerate(separators) if flag] == sep
    assert not any(result.special[i] for i in unknown) and all(result.special[i] for i in sep)
    weights = result.records["self"].every_layer_weights()
    stats = analysis.head_statistics(weights, tokens, result.special, separators)
    expected = weights[:, :, :, sep].sum(-1).mean(-1)  # [layers, heads]: weight on [SEP] only
    for s in stats:
        assert s.separator == pytest.approx(float(expected[s.layer, s.head]), abs=1e-5)
    assert all(analysis.is_punctuation(c) for c in "#%&*/@\\_")
    assert not any(analysis.is_punctuation(c) for c in ("+", "=", "<", "$", "a", "7"))


def test_a_decoders_examples_are_choices_not_the_first_querys_forced_weight(tiny_gpt, repeated_scan):
    path, _ = repeated_scan
    with store.ScanReader(path) as reader:
        for layer in range(reader.n_layers):
            for head in range(reader.n_heads):
                for criterion in CRITERIA:
                    for example in reader.examples(layer, head, criterion):
                        assert example["query"] > 0, (layer, head, criterion)  # one allowed key: no choice
                        if criterion in ("strongest", "focused"):
                            assert example["key"] not in (0, example["query"]), (layer, head, criterion)
        induction = reader.examples(2, 1, "induction")
    assert induction and induction[0]["score"] > 0.9
    top = induction[0]
    positions = list(top["window_positions"])
    assert top["key"] in positions and top["query"] in positions  # the copied-from token is shown, however far
    assert top["query"] - top["key"] > 12  # ... and it is far: the second copy reads the first


def test_a_document_too_short_to_choose_is_not_labelled():
    one_token = document_partial(0, torch.ones(1, 2, 1, 1), ["a"], ["a"], [False], None, False)
    assert one_token.labels[..., -1].tolist() == [[1, 1]]  # UNLABELLED, the last label
    assert np.isnan(one_token.rows["head_documents"][0]["normalised_entropy"]).all()
    causal_two = torch.tensor([[1.0, 0.0], [0.3, 0.7]]).expand(1, 1, 2, 2)
    partial = document_partial(0, causal_two, ["a", "b"], ["a", "b"], [False, False], None, False,
                               allowed=torch.tensor([[1, 2]]))
    assert partial.counts[0, 0, list(analysis.STATISTICS).index("normalised_entropy")] == 1  # the second query only
    assert partial.labels[0, 0, -1] == 1


def test_a_decoder_scan_offers_only_the_statistics_it_has_and_searches_past_the_forced_query(repeated_scan):
    path, _ = repeated_scan
    with store.ScanReader(path) as reader:
        applying = reader.statistics_that_apply()
        assert reader.is_causal()
        assert "next" not in applying and "separator" not in applying and "special" not in applying
        assert {"induction", "duplicate", "previous", "induction head"} <= set(applying)
        assert "next" not in reader.criteria_with_examples(2, 1)
        found, sql = reader.search_queries(query_word=None, key_word=None, layer=2, head=1, min_weight=0.0)
        assert len(found) and (found["query"] > 0).all()
        assert "?" not in sql and "t.layer = 2" in sql and "t.weight >= 0.0" in sql
        contexts = reader.query_contexts(list(zip(found["doc"], found["query"], found["key"], strict=True))[:5])
        assert all("«" in context and "⟨" in context for context in contexts)
        # a custom detector at offset -1 is the previous-token statistic, exactly
        previous, _ = reader.statistic_map("previous")
        np.testing.assert_allclose(reader.offsets_map([-1]), previous, rtol=1e-6)  # float32 sums per document


@pytest.mark.parametrize("model", ["encoder", "decoder"])
def test_every_statistic_offered_is_one_some_head_has_and_every_one_hidden_is_one_none_has(model, bert, tiny_gpt,
                                                                                         repeated_scan, tmp_path):
    """A walk of every statistic and label, on BERT (both ways) and the tiny GPT (causal): the map offers it exactly
    when some head has a value above 0 (or it is an entropy or distance, which every head has)."""
    if model == "decoder":
        path = repeated_scan[0]
    else:
        path = tmp_path / "bert.duckdb"
        corpus = Corpus("tests", [Document(text, str(i)) for i, text in enumerate(repeated_passages(4))])
        run_scan(corpus, bert, path, ScanSettings(max_docs=4, max_tokens=48))
    with store.ScanReader(path) as reader:
        applying = reader.statistics_that_apply()
        for name in SCAN_STATISTICS:
            mean, _ = reader.statistic_map(name)
            has = bool(np.nanmax(mean) > 0) if np.isfinite(mean).any() else False
            assert (name in applying) == (has or name in ("entropy", "normalised_entropy", "mean_distance")), name
        for label in LABELS:
            share, _ = reader.statistic_map(label)
            assert (label in applying) == bool(np.nan_to_num(share).max() > 0), label
        assert ("next" in applying) == (model == "encoder")  # a causal head never reads the next token
        assert ("separator" in applying) == (model == "encoder")  # [SEP] in BERT's texts, none in the tiny GPT's
