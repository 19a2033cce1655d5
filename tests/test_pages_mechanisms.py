"""AppTest for the mechanism pages: change each main widget and check the figure data changes."""

import numpy as np
import pytest

from tests.apptest_helpers import figure_containing, figure_titled, figures, open_page, plotly_array


@pytest.fixture(autouse=True)
def _clean(clean_streamlit_caches):
    yield


def titles(at):
    return [spec["layout"].get("title", {}).get("text", "") for spec in figures(at)]


def test_masks_page_patterns_and_metrics():
    at = open_page("app_pages/masks.py")
    assert not at.exception
    n = 13  # the default sentence's tokens with [CLS] and [SEP]
    at.selectbox(key="masks_pattern").set_value("causal").run()
    assert at.metric[1].value == f"{n * (n + 1) // 2:,} of {n * n:,}"
    z = plotly_array(figure_titled(at, "Causal (GPT)")["data"][0]["z"])
    assert np.array_equal(z, np.tril(np.ones((n, n))))
    at.selectbox(key="masks_pattern").set_value("sliding_causal").run()
    at.slider(key="masks_window").set_value(2).run()
    assert at.metric[3].value == "1–2"
    at.selectbox(key="masks_pattern").set_value("bigbird").run()
    spec = figure_titled(at, "BigBird")
    assert set(np.unique(plotly_array(spec["data"][0]["z"]))) <= {0, 1, 2, 3}
    at.selectbox(key="masks_pattern").set_value("lsh").run()
    assert not at.exception and "LSH" in titles(at)[0]
    assert at.metric[2].value == "O(N²·(1−(1−1/B)^R))"  # as built, not Reformer's O(N log N)


def test_masks_page_captions_match_the_numbers_it_shows():
    at = open_page("app_pages/masks.py")
    at.selectbox(key="masks_pattern").set_value("dilated").run()
    at.slider(key="masks_window").set_value(3).run()
    keys = at.metric[3].value  # "lo–hi" keys per query
    assert keys.endswith("–5")
    caption = next(c.value for c in at.caption if "spaced d = 2 apart" in c.value)
    assert "5 keys per query" in caption and "same cost" not in caption
    at.selectbox(key="masks_pattern").set_value("sliding_bidirectional").run()
    at.slider(key="masks_radius").set_value(2).run()
    assert at.metric[3].value.endswith("–5")
    reach = plotly_array(figure_titled(at, "Receptive field")["data"][0]["z"]).sum(axis=1)
    rule = next(c.value for c in at.caption if "Receptive" in c.value or "reach grows" in c.value)
    assert "by r = 2 on each side" in rule and "W-1" not in rule
    assert reach.tolist()[:2] == [3, 5]  # the last token: 1 + r, then 1 + 2r (nothing to its right)


def test_masks_page_receptive_field_and_real_head():
    at = open_page("app_pages/masks.py")
    at.selectbox(key="masks_pattern").set_value("sliding_causal").run()
    at.slider(key="masks_window").set_value(2).run()
    at.slider(key="masks_layers").set_value(3).run()
    reach = plotly_array(figure_titled(at, "Receptive field")["data"][0]["z"])
    assert reach.sum(axis=1).tolist() == [2, 3, 4]
    real = figure_titled(at, "all-MiniLM-L6-v2")
    renormalised = plotly_array(real["data"][2]["z"])
    np.testing.assert_allclose(np.nansum(renormalised, axis=1), 1.0, atol=1e-5)
    assert np.all(np.triu(np.nan_to_num(renormalised), 1) == 0)


def test_masks_page_convention_bug_and_memory():
    at = open_page("app_pages/masks.py")
    spec = figure_titled(at, "What PyTorch's SDPA does")
    subtitles = [a["text"].replace("<br>", " ") for a in spec["layout"]["annotations"]]  # lines fitted to the panel
    assert "✔ none on the future" in subtitles[0] and "✘" in subtitles[2] and "✘" in subtitles[3]
    memory = [d.value for d in at.dataframe if "dense N×N scores" in d.value.columns][0]
    assert memory.loc[memory["N"] == "131,072", "dense N×N scores"].iloc[0] == "32 GiB"
    at.selectbox(key="masks_dtype").set_value("fp32").run()
    memory = [d.value for d in at.dataframe if "dense N×N scores" in d.value.columns][0]
    assert memory.loc[memory["N"] == "131,072", "dense N×N scores"].iloc[0] == "64 GiB"


def test_positional_page_tabs_react():
    at = open_page("app_pages/positional.py")
    table = figure_titled(at, "Sinusoidal table")
    assert plotly_array(table["data"][0]["z"]).shape == (100, 128)
    at.select_slider(key="pos_sin_d").set_value(32).run()
    assert plotly_array(figure_titled(at, "Sinusoidal table")["data"][0]["z"]).shape == (100, 32)
    assert any("max error" in m.value for m in at.markdown)
    at.session_state["pos_tab"] = "Learned"
    at.run()
    assert "Learned position embeddings" in titles(at)[0]
    at.session_state["pos_tab"] = "RoPE"
    at.run()
    relative = figure_titled(at, "RoPE(q, m)")
    z = plotly_array(relative["data"][0]["z"])
    assert np.allclose(np.diag(z, 3), np.diag(z, 3)[0])
    at.session_state["pos_tab"] = "ALiBi"
    at.run()
    slopes = figure_titled(at, "Slopes for 8 heads")
    assert np.allclose(plotly_array(slopes["data"][0]["y"]), [2.0**-i for i in range(1, 9)])
    at.slider(key="pos_alibi_heads").set_value(4).run()
    assert figure_titled(at, "Slopes for 4 heads")
    at.session_state["pos_tab"] = "Word order"
    at.run()
    assert any("max difference" in s.value for s in at.success)
    at.toggle(key="pos_order_remove").set_value(False).run()
    assert any("differ by up to" in w.value for w in at.warning)


def test_scaling_page_reacts():
    at = open_page("app_pages/scaling.py")
    assert not at.exception
    histogram = figure_titled(at, "Distribution of scores at d_k = 64")
    assert len(histogram["data"]) == 2
    unscaled, scaled = (plotly_array(trace["x"]) for trace in histogram["data"])  # the samples, sent as arrays
    assert unscaled.size == scaled.size == 4000
    assert abs(unscaled.std() - 8) < 0.5 and abs(scaled.std() - 1) < 0.07  # √64 and 1
    at.select_slider(key="scale_d_hist").set_value(1024).run()
    assert figure_titled(at, "Distribution of scores at d_k = 1024")
    real = figure_containing(at, "layer 0, head 0: its real Q and K")
    before = [a["text"] for a in real["layout"]["annotations"]]
    at.slider(key="scale_temperature").set_value(4.0).run()
    after = [a["text"] for a in figure_containing(at, "its real Q and K")["layout"]["annotations"]]
    assert before[:2] == after[:2] and before[2] != after[2]
    stability = [d.value for d in at.dataframe if "method" in d.value.columns][0]
    assert not stability[(stability["method"] == "naive") & (stability["max logit"] == 100)]["finite"].any()


def scaling_captions(at):
    return [c.value for c in at.caption]


def test_scaling_page_statements_hold_at_other_settings():
    at = open_page("app_pages/scaling.py")
    at.select_slider(key="scale_d").set_value(8).run()
    at.select_slider(key="scale_samples").set_value(500).run()
    captions = " ".join(scaling_captions(at))
    assert "exactly" not in captions  # 500 samples do not give the variance exactly
    variance = figure_titled(at, "Variance of q·k")
    measured = plotly_array(variance["data"][0]["y"])
    theory = plotly_array(variance["data"][1]["y"])
    worst = np.max(np.abs(measured / theory - 1))
    assert f"within {worst:.1%}" in captions
    entropy = figure_titled(at, "entropy (nats)")
    at_8 = plotly_array(entropy["data"][0]["y"])[3]  # d_k values 1, 2, 4, 8, ...
    assert f"Scaled: {at_8:.2f} nats at d_k = 8" in captions
    # The real head: "nearly one-hot" only when the largest weights say so.
    real_caption = next(c for c in scaling_captions(at) if "without the 1/√d_k this head" in c)
    largest = float(real_caption.split("averages ")[1].split(" ")[0])
    assert ("nearly one-hot" in real_caption) == (largest >= 0.9)


def test_scaling_page_sorted_weights_share_one_axis():
    at = open_page("app_pages/scaling.py")
    ranges = [spec["layout"]["yaxis"]["range"] for spec in figures(at)
              if spec["layout"]["title"]["text"].startswith("One query's weights")]
    assert len(ranges) == 2 and ranges[0] == ranges[1]


def test_heads_and_kv_cache_page_reacts():
    at = open_page("app_pages/heads_kv_cache.py")
    table = at.table[0].value
    assert table["KV cache, all layers"].tolist() == ["10 GiB", "1.25 GiB", "160 MiB"]  # Llama 2 70B, 4096 tok, fp16
    at.selectbox(key="kv_dtype").set_value("fp32").run()
    assert at.table[0].value["KV cache, all layers"].tolist()[1] == "2.5 GiB"
    assert "per cached token" in at.table[0].value.columns
    at.selectbox(key="kv_preset").set_value("Current checkpoint: all-MiniLM-L6-v2 (bundled BERT)").run()
    assert not at.exception
    assert at.table[0].value["K/V heads"].tolist() == [12, 4, 1]
    cross = figure_containing(at, "decoder queries attend over")
    assert plotly_array(cross["data"][0]["z"]).shape[1] == 11  # encoder tokens of the default sentence, no specials
    at.text_input(key="kv_target").input("dog").run()
    assert plotly_array(figure_containing(at, "1 decoder queries")["data"][0]["z"]).shape == (1, 11)


def test_kv_cache_page_says_when_a_window_or_the_context_limits_the_cache():
    at = open_page("app_pages/heads_kv_cache.py")
    at.selectbox(key="kv_preset").set_value("Mistral 7B (v0.1)").run()
    at.select_slider(key="kv_seq").set_value(32768).run()
    assert any("only the last 4,096" in i.value for i in at.info)
    assert at.table[0].value["KV cache, all layers"].tolist()[1] == "512 MiB"  # 2 x 32 x 8 x 128 x 4096 x 2 B
    at.selectbox(key="kv_preset").set_value("GPT-2 (124M)").run()
    at.select_slider(key="kv_seq").set_value(131072).run()
    assert any("reads at most 1,024 tokens" in w.value for w in at.warning)
    at.select_slider(key="kv_seq").set_value(1024).run()
    assert not any("reads at most" in w.value for w in at.warning)
    at.number_input(key="kv_batch").set_value(4).run()
    assert at.table[0].value["per cached token"].tolist()[0] == "36 KiB"  # 2 x 12 x 12 x 64 x 2 B, any batch
