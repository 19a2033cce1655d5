"""What the Heads and KV cache page states about the current model's cache equals what the model's own cache
holds: every tested decoder is run by transformers with ``use_cache=True`` and its cache's tensors are weighed.

The text is shorter than any tiny checkpoint's sliding window, so every layer holds every token here; past the
window (what transformers keeps between two steps, and GPT-Neo's cache that keeps every token) is weighed in
tests/test_layer_facts.py, whose configs shrink the windows to 4."""

import pytest
import torch

from attnviz.models import architectures
from attnviz.models.loading import load_model_dir
from attnviz.pagelogic.heads_kv_cache import cache_table, checkpoint_config

DECODERS = [record.model_type for record in architectures.RECORDS if record.role == "decoder" and record.listed]
TOKENS = 3


def cache_bytes_held(model, n_tokens: int) -> int:
    """The bytes of every key and value tensor in the cache the model returns after reading ``n_tokens``."""
    ids = torch.randint(5, 90, (1, n_tokens), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    return sum(tensor.numel() * tensor.element_size()
               for layer in cache.layers for tensor in (layer.keys, layer.values) if tensor is not None)


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint


@pytest.mark.parametrize("kind", DECODERS)
def test_the_stated_cache_of_this_model_is_what_its_cache_holds(checkpoint, kind):
    bundle = load_model_dir(checkpoint(kind))
    table = cache_table(checkpoint_config(bundle), TOKENS, 1, "fp32")
    (stated,) = table.loc[table["variant"].str.endswith("← this model"), "total bytes"]
    assert stated == cache_bytes_held(bundle.model, TOKENS)


def test_a_multi_query_falcon_is_said_to_cache_one_kv_head(checkpoint):
    """Falcon's config says num_kv_heads = 4 while multi_query = True: its attention (and cache) has one K/V head."""
    bundle = load_model_dir(checkpoint("falcon"))
    assert bundle.model.config.multi_query and bundle.model.config.num_kv_heads == 4
    assert bundle.n_kv_heads == 1
    assert "1 K/V heads" in bundle.describe() or "1 K/V head" in bundle.describe()

