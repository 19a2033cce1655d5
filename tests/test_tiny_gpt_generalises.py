"""The bundled tiny GPT's circuits work on inputs it never saw (issue: teaching moments that work on what people
type): Olsson et al.'s test on fresh random tokens from the whole vocabulary, English sentences of our own typed
twice, and the previous-token head on held-out prose. Measured here with fresh seeds, independently of the numbers
the training script recorded, and the card's numbers checked against training.json."""

import json

import pytest
import torch

from attnviz.core import circuits
from attnviz.models.shipped import BUNDLED_GPT_DIR
from attnviz.models.with_heads import load_causal_lm
from attnviz.pagelogic.generation import decode as gen
from attnviz.pagelogic.generation import heads as gen_heads
from attnviz.tiny_gpt.text import REPEAT_SENTENCES, documentation_text


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_causal_lm(BUNDLED_GPT_DIR)
    return model, tokenizer


@pytest.fixture(scope="module")
def report():
    return json.loads((BUNDLED_GPT_DIR / "training.json").read_text())


def _best(scores: list[list[float]]) -> tuple[float, int, int]:
    return max((value, layer, head) for layer, row in enumerate(scores) for head, value in enumerate(row))


def test_induction_on_random_tokens_of_the_whole_vocabulary(tiny):
    """Fresh seeds (the script measured seed 2000 on), lengths 10 to 100, every ordinary token allowed."""
    model, tokenizer = tiny
    measured = circuits.random_repeats(model, tokenizer, lengths=(10, 30, 60, 100), seeds=3, seed=777)
    score, layer, _ = _best(measured["induction"])
    assert layer >= 1 and score >= 0.5, measured["induction"]
    assert measured["second_loss"] <= 0.3 * measured["first_loss"], measured
    # every length on its own, not only the mean (eight sequences each: at 10 tokens, two sequences' ratio moved
    # between 0.22 and 0.48 from model to model where eight moved between 0.18 and 0.33)
    for length in (10, 100):
        alone = circuits.random_repeats(model, tokenizer, lengths=(length,), seeds=8, seed=4242)
        assert alone["ratio"] <= 0.4, (length, alone)


def test_sentences_typed_twice_are_nearly_free_the_second_time(tiny):
    model, tokenizer = tiny
    assert len(REPEAT_SENTENCES) >= 20
    corpus = documentation_text()
    assert not any(sentence in corpus for sentence in REPEAT_SENTENCES)  # our own, not the training text
    measured = circuits.sentences_typed_twice(model, tokenizer, REPEAT_SENTENCES)
    assert measured["second_loss"] <= 0.4 * measured["first_loss"], measured
    assert measured["continued"] >= 0.7, measured  # the second copy's next token is greedy's choice


def test_greedy_decoding_continues_a_repeat(tiny):
    """'A B C ... A B' continues with C, through the page's own generation loop (its KV cache): each sentence typed
    once, then its first three words again; greedy decoding's next word is the sentence's fourth. (A 2-layer model
    matched one token back: a piece that occurs twice in the sentence, such as " the", left it two candidates, and 15
    of 24 continued; the 3-layer models shipped since continue 20 to 22.)"""
    model, tokenizer = tiny
    fox = "The quick brown fox jumps over the lazy dog."
    result = gen.generate(model, tokenizer, fox + " The quick brown", 12, gen.Sampling("greedy"))
    assert result.text(tokenizer).startswith(" fox jumps over the")
    continued = []
    for sentence in REPEAT_SENTENCES:
        words = sentence.split(" ")
        prompt = sentence + " " + " ".join(words[:3])
        result = gen.generate(model, tokenizer, prompt, 8, gen.Sampling("greedy"))
        continued.append((prompt + result.text(tokenizer)).startswith(sentence + " " + " ".join(words[:4])))
    assert sum(continued) / len(continued) >= 0.8, continued  # 20 of 24 by the model shipped on 2026-12-06


def test_the_previous_token_head_holds_on_held_out_prose(tiny, report):
    model, tokenizer = tiny
    found = {head.name: head for head in gen_heads.find_circuits(model, tokenizer, gen_heads.held_out_text(),
                                                                 pool=report["repeat_token_ids"])}
    previous = found["previous-token head"]
    assert previous.layer == 0 and previous.score >= 0.8
    # and on our own sentences (prose the model never saw, not documentation)
    ids = tokenizer(" ".join(REPEAT_SENTENCES), return_tensors="pt")["input_ids"][:, :256]
    with torch.no_grad():
        weights = model(input_ids=ids, output_attentions=True).attentions[0][0, previous.head]
    assert float(circuits.previous_token_score(weights)) >= 0.7


def test_everyday_english_words_are_single_tokens(tiny):
    """The 4,096-token BPE counted wordfreq's common English words: what people type reads as words, not bytes."""
    import re

    import wordfreq

    _, tokenizer = tiny
    assert len(tokenizer) >= 4_000
    frequent = [word for word in wordfreq.top_n_list("en", 1_000) if word.isalpha()]
    split = [word for word in frequent if len(tokenizer(" " + word, add_special_tokens=False)["input_ids"]) > 1]
    assert len(split) <= 0.01 * len(frequent), split  # none when it was trained
    # and on our own sentences, which the BPE never counted: most of their words are whole
    words = [word for sentence in REPEAT_SENTENCES for word in re.findall(r"[a-z]+", sentence)]
    whole = [len(tokenizer(" " + word, add_special_tokens=False)["input_ids"]) == 1 for word in words]
    assert sum(whole) / len(whole) >= 0.6  # 0.69 when it was trained; 0.25 with the 512-token BPE
    pieces = tokenizer.tokenize(" The doctor told him to drink more water")
    assert pieces == ["ĠThe", "Ġdoctor", "Ġtold", "Ġhim", "Ġto", "Ġdrink", "Ġmore", "Ġwater"]


def test_every_word_of_letters_among_the_thousand_most_frequent_is_one_token(tiny):
    """What the README says: after a space, each word of letters among wordfreq's 1,000 most frequent English words
    is one token; what is not is a contraction or digits."""
    wordfreq = pytest.importorskip("wordfreq")
    _, tokenizer = tiny
    split = [word for word in wordfreq.top_n_list("en", 1000)
             if len(tokenizer(" " + word, add_special_tokens=False)["input_ids"]) != 1]
    assert [word for word in split if word.isalpha()] == []
    assert all("'" in word or "." in word or word.isdigit() for word in split), split


def test_the_apps_own_sentences_read_word_by_word(tiny):
    """The sidebar's default sentence and the cross-attention example: one token per word on the bundled GPT."""
    from attnviz.tiny_gpt.text import APP_SENTENCES, DEFAULT_SENTENCE, app_words
    from attnviz.ui.sidebar import DEFAULT_SENTENCE as SIDEBAR_SENTENCE

    _, tokenizer = tiny
    assert SIDEBAR_SENTENCE == DEFAULT_SENTENCE == APP_SENTENCES[0]
    for word in app_words():
        assert len(tokenizer(" " + word, add_special_tokens=False)["input_ids"]) == 1, word
    assert tokenizer.tokenize(DEFAULT_SENTENCE) == ["The", "Ġcat", "Ġsat", "Ġon", "Ġthe", "Ġmat", "Ġbecause", "Ġit",
                                                    "Ġwas", "Ġtired", "."]


def test_the_card_states_what_the_script_measured(report):
    card = (BUNDLED_GPT_DIR / "README.md").read_text()
    repeats, sentences = report["random_repeats"], report["sentences_twice"]
    assert f"{_best(repeats['induction'])[0]:.3f}" in card
    assert f"{repeats['ratio']:.2f}" in card and f"{sentences['ratio']:.2f}" in card
    # 20 minutes on the 2-core machine that trained the model shipped until 2026-12-06 (16.3); the same recipe's
    # steps take 26.6 on the slower 2-core machine that made the run shipped now (docs/benchmarks.md, 2026-12-06)
    assert report["seconds"] <= 30 * 60
    assert (BUNDLED_GPT_DIR / "model.safetensors").stat().st_size <= 20 * 2**20
