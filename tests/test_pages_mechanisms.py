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
    at = open_page("pages/masks.py")
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


def test_masks_page_receptive_field_and_real_head():
    at = open_page("pages/masks.py")
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
    at = open_page("pages/masks.py")
    spec = figure_titled(at, "What PyTorch's SDPA does")
    subtitles = [a["text"] for a in spec["layout"]["annotations"]]
    assert "✔ none on the future" in subtitles[0] and "✘" in subtitles[2] and "✘" in subtitles[3]
    memory = [d.value for d in at.dataframe if "dense N×N scores" in d.value.columns][0]
    assert memory.loc[memory["N"] == "131,072", "dense N×N scores"].iloc[0] == "32 GiB"
    at.selectbox(key="masks_dtype").set_value("fp32").run()
    memory = [d.value for d in at.dataframe if "dense N×N scores" in d.value.columns][0]
    assert memory.loc[memory["N"] == "131,072", "dense N×N scores"].iloc[0] == "64 GiB"


def test_positional_page_tabs_react():
    at = open_page("pages/positional.py")
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
    at = open_page("pages/scaling.py")
    assert not at.exception
    histogram = figure_titled(at, "Distribution of scores at d_k = 64")
    assert len(histogram["data"]) == 2
    at.select_slider(key="scale_d_hist").set_value(1024).run()
    assert figure_titled(at, "Distribution of scores at d_k = 1024")
    real = figure_containing(at, "layer 0, head 0: its real Q and K")
    before = [a["text"] for a in real["layout"]["annotations"]]
    at.slider(key="scale_temperature").set_value(4.0).run()
    after = [a["text"] for a in figure_containing(at, "its real Q and K")["layout"]["annotations"]]
    assert before[:2] == after[:2] and before[2] != after[2]
    stability = [d.value for d in at.dataframe if "method" in d.value.columns][0]
    assert not stability[(stability["method"] == "naive") & (stability["max logit"] == 1000)]["finite"].any()


def test_heads_and_kv_cache_page_reacts():
    at = open_page("pages/heads_kv_cache.py")
    table = at.dataframe[0].value
    assert table["KV cache, all layers"].tolist() == ["10 GiB", "1.25 GiB", "160 MiB"]  # Llama 2 70B, 4096 tok, fp16
    at.selectbox(key="kv_dtype").set_value("fp32").run()
    assert at.dataframe[0].value["KV cache, all layers"].tolist()[1] == "2.5 GiB"
    at.selectbox(key="kv_preset").set_value("Current checkpoint: all-MiniLM-L6-v2 (bundled BERT)").run()
    assert not at.exception
    assert at.dataframe[0].value["K/V heads"].tolist() == [12, 4, 1]
    cross = figure_containing(at, "decoder queries attend over")
    assert plotly_array(cross["data"][0]["z"]).shape[1] == 11  # encoder tokens of the default sentence, no specials
    at.text_input(key="kv_target").input("dog").run()
    assert plotly_array(figure_containing(at, "1 decoder queries")["data"][0]["z"]).shape == (1, 11)
