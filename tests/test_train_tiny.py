"""``python -m attnviz.tiny_gpt.train``, the script that made the bundled tiny GPT: its batches train every position of
the context, and a few steps of it write a folder that loads like the shipped one, with the shipped tokenizer
(the seeded set-up reproduces it). Training itself is never rerun in full here (minutes of CPU)."""

import json
from dataclasses import replace

import pytest
import torch

from attnviz.models.shipped import BUNDLED_GPT_DIR
from attnviz.tiny_gpt import train as train_tiny


def shipped_recipe() -> train_tiny.Recipe:
    recorded = json.loads((BUNDLED_GPT_DIR / "training.json").read_text())["recipe"]
    recorded["repeat_periods"] = tuple(recorded["repeat_periods"])
    recorded["text_repeat_span"] = tuple(recorded["text_repeat_span"])
    return train_tiny.Recipe(**recorded)


def test_the_default_recipe_is_the_shipped_one():
    assert shipped_recipe() == train_tiny.Recipe()


def test_the_shipped_card_is_what_the_script_writes_from_its_report():
    """The model card is written from the recipe and training.json alone: the shipped one, word for word."""
    from attnviz.tiny_gpt.card import model_card

    recipe = shipped_recipe()
    report = json.loads((BUNDLED_GPT_DIR / "training.json").read_text())
    card = model_card(recipe, report, long_batch=train_tiny.long_batch_size(recipe),
                      copied_positions=train_tiny.copies_positions(recipe), eos=train_tiny.EOS,
                      rare_count=train_tiny.RARE_WORD_COUNT)
    assert card == (BUNDLED_GPT_DIR / "README.md").read_text()
    assert "fused" not in card
    fused = model_card(replace(recipe, fused_loss=True), report, long_batch=train_tiny.long_batch_size(recipe),
                       copied_positions=True, eos=train_tiny.EOS, rare_count=train_tiny.RARE_WORD_COUNT)
    assert "the LM head and its loss fused" in fused  # a run with --fused-loss says so on its card


def test_batches_repeat_random_tokens_and_shifted_rows_reach_the_end_of_the_context():
    recipe = replace(train_tiny.Recipe(), batch=64, shifted_share=0.5)
    ids = torch.arange(10_000) % 400 + 1
    tokens, positions = next(train_tiny.batches(ids, recipe, torch.Generator().manual_seed(0), list(range(1, 385))))
    assert tokens.shape == positions.shape == (64, recipe.train_length)
    n_text, n_repeats, _ = train_tiny.batch_rows(recipe)
    for row in tokens[n_text : n_text + n_repeats]:  # A B C ... A B C ...: some period repeats it exactly
        assert any(torch.equal(row[p:], row[:-p]) for p in range(*recipe.repeat_periods))
    steps = positions[:, 1:] - positions[:, :-1]
    assert (steps == 1).all()  # each row is consecutive positions
    starts = positions[:, 0]
    assert 0.25 < float((starts > 0).float().mean()) < 0.75  # about half the rows shifted
    assert int(positions.max()) <= recipe.context - 1 and int(positions.max()) > recipe.context - 16
    unshifted = replace(recipe, shifted_share=0.0)
    _, positions = next(train_tiny.batches(ids, unshifted, torch.Generator().manual_seed(0), list(range(1, 385))))
    assert (positions == torch.arange(recipe.train_length)).all()


def test_repeated_rows_are_random_tokens_of_the_whole_pool_or_pieces_of_the_text():
    """Half the repeated rows: random tokens of the pool; the other half: short windows of the text from random
    places, joined (English the model cannot recite), each pattern repeated exactly, at least twice."""
    recipe = replace(train_tiny.Recipe(), batch=64)
    ids = torch.arange(100_000) + 1000  # each token id names its place in the text
    pool = list(range(1, 385))
    tokens, _ = next(train_tiny.batches(ids, recipe, torch.Generator().manual_seed(0), pool))
    n_text, n_repeats, _ = train_tiny.batch_rows(recipe)
    rows = tokens[n_text : n_text + n_repeats]
    from_text = [bool((row >= 1000).all()) for row in rows]
    from_pool = [bool((row < 385).all()) for row in rows]
    assert all(a or b for a, b in zip(from_text, from_pool, strict=True))
    assert sum(from_text) == round(n_repeats * recipe.text_repeat_share)
    for row, text in zip(rows, from_text, strict=True):
        period = next(p for p in range(*recipe.repeat_periods) if torch.equal(row[p:], row[:-p]))
        assert 2 * period <= recipe.train_length  # two copies at least
        if text:  # consecutive runs of the text, each at most the span's longest
            breaks = (row[1:period] - row[: period - 1] != 1).nonzero().flatten().tolist()
            runs = [b - a for a, b in zip([-1] + breaks, breaks + [period - 1], strict=True)]
            assert len(runs) >= 2 and max(runs) < recipe.text_repeat_span[1]


def test_impossible_recipes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="positions"):
        train_tiny.train(replace(train_tiny.Recipe(), train_length=512), tmp_path)
    with pytest.raises(ValueError, match="long_steps"):
        train_tiny.train(replace(train_tiny.Recipe(), steps=10, long_steps=10), tmp_path)


def test_the_command_line_defaults_are_the_shipped_recipe_on_two_threads(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(train_tiny, "train", lambda recipe, out, threads: calls.append((recipe, threads)) or {
        "seconds": 1.0, "held_out_loss": 1.0, "circuits": {"previous_token": [[0.0]], "induction": [[0.0]]}})
    train_tiny.main(["--out", str(tmp_path)])
    assert calls == [(shipped_recipe(), 2)]


def test_positions_are_copied_only_where_a_table_was_trained():
    recipe = train_tiny.Recipe()
    assert train_tiny.copies_positions(recipe)
    for other in (replace(recipe, architecture="llama"), replace(recipe, position_init="sinusoidal"),
                  replace(recipe, train_length=recipe.context), replace(recipe, long_steps=0)):
        assert not train_tiny.copies_positions(other)
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_positions=300, n_embd=8, n_layer=1, n_head=2, vocab_size=10))
    table = model.transformer.wpe.weight.detach().clone()
    train_tiny.extend_positions(model, 128)
    extended = model.transformer.wpe.weight
    assert torch.equal(extended[:128], table[:128]) and torch.equal(extended[128:256], table[:128])
    assert torch.equal(extended[256:], table[:44])  # 300 positions: the last copy is cut short


def test_a_few_steps_of_a_llama_run_through_the_long_phase(tmp_path):
    recipe = replace(train_tiny.Recipe(), architecture="llama", steps=3, long_steps=2)
    report = train_tiny.train(recipe, tmp_path, log=lambda line: None)
    assert report["recipe"]["architecture"] == "llama" and (tmp_path / "model.safetensors").is_file()
    assert "copies" not in (tmp_path / "README.md").read_text()  # RoPE has no table to copy


@pytest.mark.timeout(600)
def test_a_few_steps_write_a_folder_that_loads_like_the_shipped_one(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = replace(shipped_recipe(), steps=3, long_steps=2)
    report = train_tiny.train(recipe, tmp_path, log=lambda line: None)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert model.config.n_positions == recipe.context and model.config.vocab_size == recipe.vocab_size
    # Seeded: the same byte-level BPE and the same pool of repeated tokens as the shipped model.
    shipped = AutoTokenizer.from_pretrained(BUNDLED_GPT_DIR, local_files_only=True)
    assert tokenizer.get_vocab() == shipped.get_vocab()
    assert report["repeat_token_ids"] == json.loads((BUNDLED_GPT_DIR / "training.json").read_text())[
        "repeat_token_ids"]
    card = (tmp_path / "README.md").read_text()
    for words in ("Data", "pydoc_data", "3 steps", "Final loss", "Licence"):
        assert words in card
    written = json.loads((tmp_path / "training.json").read_text())
    assert written["recipe"]["steps"] == 3 and len(written["held_out_loss_by_half"]) == 2
    assert set(written["circuits"]) == {"previous_token", "induction", "period"}


def test_whole_words_start_as_berts_and_rare_ones_keep_that_direction():
    """The BPE keeps the app's words whole; the first dimensions of their embeddings start from the bundled BERT's
    (kitten near cat, far from a word of another kind), the rest as GPT-2's; for the words the text barely uses,
    those first dimensions are set back to their direction after a step, at the length the rows that train have
    there, while the rest trains."""
    from attnviz.tiny_gpt.text import app_words

    text = "The function returns a list of values. " * 50
    tokenizer = train_tiny.train_tokenizer(text, 400, whole_words=tuple(app_words()))
    for word in ("cat", "kitten", "rug", "mat"):
        assert tokenizer.tokenize(f" {word}") == [f"Ġ{word}"]
    recipe = replace(train_tiny.Recipe(), vocab_size=len(tokenizer))
    torch.manual_seed(0)
    model = train_tiny.build_model(recipe, tokenizer)
    start = model.get_input_embeddings().weight.detach().clone()
    dims = recipe.bert_dims  # the dimensions that start as BERT's
    assert 0 < dims < recipe.n_embd
    moved = train_tiny.transplant_word_embeddings(model, tokenizer, dims)
    embedding = model.get_input_embeddings().weight
    row = {word: tokenizer.convert_tokens_to_ids(f"Ġ{word}") for word in ("cat", "kitten", "function", "values")}
    assert {row["cat"], row["kitten"], row["function"]} <= set(moved)

    def cosine(a: str, b: str, part=slice(None)) -> float:
        rows = embedding.detach()
        return float(torch.nn.functional.cosine_similarity(rows[row[a], part], rows[row[b], part], dim=0))

    assert cosine("cat", "kitten", slice(0, dims)) > 0.5 > 0.2 > cosine("kitten", "function", slice(0, dims))
    assert cosine("cat", "kitten") > cosine("kitten", "function")  # the whole rows, most of them random
    untouched = [i for i in range(len(tokenizer)) if i not in set(moved)]
    assert torch.equal(embedding[untouched], start[untouched])  # pieces and punctuation start as GPT-2's
    assert torch.equal(embedding[moved, dims:], start[moved, dims:])
    # "kitten" never occurs in the text, "function" 50 times: only the first keeps its BERT part
    ids = torch.tensor(tokenizer(text)["input_ids"])
    rare = train_tiny.rare_word_rows(tokenizer, ids, moved)
    assert row["kitten"] in rare and row["function"] in moved and row["function"] not in rare
    kept = train_tiny.KeptDirections(embedding, rare, dims)
    before = embedding[row["kitten"]].detach().clone()
    noise = torch.randn_like(embedding)
    with torch.no_grad():
        embedding.add_(noise)  # what steps of Adam do to every row
    kept.restore()
    after = embedding[row["kitten"]].detach()
    kept_part = torch.nn.functional.cosine_similarity(after[:dims], before[:dims], dim=0)
    assert float(kept_part) == pytest.approx(1, abs=1e-6)
    assert torch.allclose(after[dims:], before[dims:] + noise[row["kitten"], dims:])  # trains
    trained = torch.ones(len(embedding), dtype=torch.bool)
    trained[rare] = False
    assert float(after[:dims].norm()) == pytest.approx(float(embedding[trained, :dims].norm(dim=-1).mean()), rel=1e-5)
