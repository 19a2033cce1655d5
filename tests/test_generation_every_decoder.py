"""Every tested decoder type walked through what the Generation page states, each statement checked against the
model itself: a causal LM of each type (its tiny config, sliding windows shrunk to 4 so that the prompt runs past
them) is saved and loaded as the page loads it, generates greedily, and each step's tokens, weights, row sums,
windows and cache are compared with transformers' own ``generate`` and a cache-free full forward pass."""

import pytest
import torch

from attnviz.models.architectures import ARCHITECTURES, TESTED_MODEL_TYPES
from attnviz.pagelogic.generation import decode as gen
from attnviz.pagelogic.generation import reading as reading

DECODERS = [kind for kind in TESTED_MODEL_TYPES if ARCHITECTURES[kind].role == "decoder"]
WINDOW = 4
PROMPT = "the cat sat on the mat and then it slept"  # 12 tokens with [CLS] and [SEP]: three windows long
NEW = 4


def _windowed_causal_lm(kind: str, folder):
    from tests.test_generation_windows import _causal_lm
    from tests.tiny_models import tiny_config

    # a window the config sets, made shorter than the prompt
    windowed = isinstance(getattr(tiny_config(kind), "sliding_window", None), int)
    return _causal_lm(kind, folder, **({"sliding_window": WINDOW} if windowed else {}))


@pytest.mark.parametrize("kind", DECODERS)
def test_what_the_generation_page_states_is_what_the_model_does(kind, tmp_path):
    from attnviz.models.with_heads import load_causal_lm

    model, tokenizer = load_causal_lm(_windowed_causal_lm(kind, tmp_path / kind))
    result = gen.generate(model, tokenizer, PROMPT, NEW, gen.Sampling("greedy"))
    prompt = tokenizer(PROMPT, return_tensors="pt")["input_ids"]  # [1, prompt]
    generated = [step.token_id for step in result.steps]
    # The tokens: transformers' own greedy generate (no end token stops a random model here).
    with torch.no_grad():
        reference = model.generate(prompt, max_new_tokens=len(generated), min_new_tokens=len(generated),
                                   do_sample=False)[0, prompt.shape[1]:].tolist()
    assert generated == reference and len(generated) >= 1
    ids = torch.tensor([prompt[0].tolist() + generated])
    with torch.no_grad():
        full = model(input_ids=ids, output_attentions=True).attentions  # no cache, the whole sequence
    for index, step in enumerate(result.steps):
        query = step.position - 1
        expected = torch.stack([layer[0, :, query, : step.position] for layer in full])  # [layers, heads, keys]
        torch.testing.assert_close(step.attention, expected.to(step.attention.dtype), atol=1e-5, rtol=1e-4)
        for layer in range(len(full)):
            # What the weights sum to: the number stated is the row's own; a sink is named only where it is.
            for head in range(expected.shape[1]):
                total = float(expected[layer, head].sum())
                statement = reading.row_sum_statement(result, index, layer, head)
                assert statement.startswith(f"they sum to {total:.2f}")
                assert ("learned sink" in statement) == (result.layers[layer].sinks is True)
                if abs(total - 1) >= 5e-3:
                    assert "sink" in statement or "not 1" in statement
            # Where a window leaves keys out: the first key the query really reads.
            read = (full[layer][0, :, query, : step.position] != 0).any(0)
            first = int(read.nonzero()[0])
            window = reading.window_statement(result, index, layer)
            if first:
                assert window is not None and f"reads only positions {first} to {query}" in window
            else:
                assert window is None
        # The cache after this step, per layer, as an independent run with use_cache leaves it.
        with torch.no_grad():
            cache = model(input_ids=ids[:, : step.position], use_cache=True).past_key_values
        held = [int(layer.keys.shape[-2]) for layer in cache.layers]
        assert [shape[2] for shape in step.cache_keys] == held
        assert reading.cache_holds(step) == reading.cache_holds(
            gen.Step(step.position, step.token_id, step.token, [], step.attention,
                     [(1, 1, tokens, 1) for tokens in held], 0, 0.0))
    # Sliding layers in transformers keep W - 1 keys between steps: said where it happens.
    sliding = [layer for layer, facts in enumerate(result.layers) if facts.sliding and facts.window]
    if sliding and kind != "gpt_neo":
        last = result.steps[-1]
        assert all(last.cache_keys[layer][2] == result.layers[layer].window - 1 for layer in sliding)
        assert f"{WINDOW - 1} tokens in " in reading.cache_holds(last)
