"""AppTest: Explore heads and Checkpoints, as a user drives them."""

import numpy as np
import pytest

from attnviz.app import SCRIPT
from attnviz.models.capture import capture
from tests.apptest_helpers import figures, open_page, plotly_array
from tests.tiny_models import bundled_bert, make_tiny_checkpoint, zip_folder

EXPLORE = "app_pages/explore_heads.py"
CHECKPOINTS = "app_pages/checkpoints.py"


@pytest.fixture(autouse=True)
def _clean(clean_streamlit_caches):
    yield


def main_figure(at):
    return figures(at)[0]


def replay_difference_shown(at) -> float:
    text = next(m.value for m in at.markdown if "Replay check" in m.value)
    if "**exactly**" in text:
        return 0.0
    return float(text.split("to within **")[1].split("**")[0])


def test_default_model_renders_a_head_with_the_replay_check():
    at = open_page(EXPLORE)
    spec = main_figure(at)
    assert spec["layout"]["title"]["text"].startswith("Layer 0, head 2: self-attention")
    assert replay_difference_shown(at) < 1e-5
    z = plotly_array(spec["data"][0]["z"])
    np.testing.assert_allclose(z.sum(axis=1), 1.0, atol=1e-5)
    # It opens on a head whose structure shows at once: the previous token takes most of each word's weight.
    words = range(2, z.shape[0] - 1)  # after [CLS] and the first word, before [SEP]
    assert np.mean([z[i].argmax() == i - 1 for i in words]) >= 0.8


def test_type_a_sentence_and_change_layer_head_view():
    at = open_page(EXPLORE)
    # AppTest drops the sidebar's elements from its tree after switch_page (the browser shows them; see the e2e
    # tests), so the sidebar's sentence is typed through its session-state key.
    at.session_state["sentence"] = "Dogs chase cats in the garden."
    at.run()
    at.number_input(key="layer").set_value(3).run()
    at.number_input(key="head").set_value(7).run()
    assert not at.exception
    spec = main_figure(at)
    assert spec["layout"]["title"]["text"].startswith("Layer 3, head 7")
    expected = capture(bundled_bert(), "Dogs chase cats in the garden.").records["self"].weights[3, 7]
    np.testing.assert_allclose(plotly_array(spec["data"][0]["z"]), expected.numpy(), atol=1e-6)
    assert "1 · dogs" in spec["layout"]["yaxis"]["ticktext"]
    for view, title in (("grid", "All 6 x 12 heads"), ("lines", "Layer 3: self-attention, head 7"),
                        ("average", "Layer 3: average"), ("rollout", "Attention rollout")):
        at.segmented_control(key="view").set_value(view).run()
        assert not at.exception
        assert main_figure(at)["layout"]["title"]["text"].startswith(title), view


def test_sentence_pair_blocks_and_hidden_specials():
    at = open_page(EXPLORE)
    at.text_input(key="explore_pair").input("It was tired.").run()
    at.selectbox(key="explore_block").set_value("A→B").run()
    at.toggle(key="explore_hide_special").set_value(True).run()
    spec = main_figure(at)
    assert "block A→B" in spec["layout"]["title"]["text"]
    assert all("[SEP]" not in t for t in spec["layout"]["xaxis"]["ticktext"])
    np.testing.assert_allclose(plotly_array(spec["data"][0]["z"]).sum(axis=1), 1.0, atol=1e-5)


def test_empty_sentence_is_a_message():
    at = open_page(EXPLORE, sentence="  ")
    assert not at.exception
    assert any("empty" in w.value for w in at.warning)


def test_deep_link_reopens_the_view():
    from streamlit.testing.v1 import AppTest


    at = AppTest.from_file(str(SCRIPT), default_timeout=120)
    at.query_params.update({"layer": "2", "head": "4", "view": "Grid", "sentence": "A linked sentence."})
    at.run()
    assert not at.exception
    assert at.number_input(key="layer").value == 2 and at.number_input(key="head").value == 4
    assert main_figure(at)["layout"]["title"]["text"].startswith("All 6 x 12 heads")
    assert at.text_area(key="sentence").value == "A linked sentence."


def test_statistics_tab_and_what_if_tab():
    at = open_page(EXPLORE)
    at.tabs  # noqa: B018 - the tabs exist
    at.session_state["explore_tab"] = "Head statistics"
    at.run()
    assert not at.exception
    frames = [d for d in at.dataframe if len(d.value) == 72]
    assert frames and "label" in frames[0].value.columns
    at.session_state["explore_tab"] = "What-if"
    at.run()
    at.selectbox(key="whatif_mask").set_value("causal").run()
    assert not at.exception
    after = next(s for s in figures(at) if s["layout"]["title"]["text"].startswith("After: Causal (GPT)"))
    z = plotly_array(after["data"][0]["z"])
    assert np.all(np.triu(np.nan_to_num(z), k=1) == 0)
    title = "All 12 heads of layer 0, before and after"
    grid = next(s for s in figures(at) if s["layout"]["title"]["text"].startswith(title))
    assert grid["layout"]["yaxis"]["ticktext"] == ["before", "after"]


def test_upload_a_zipped_tiny_checkpoint_and_switch_to_it(tmp_path):
    folder = make_tiny_checkpoint("llama", tmp_path / "tiny-llama")
    data = zip_folder(folder, tmp_path / "tiny-llama.zip").read_bytes()
    at = open_page(CHECKPOINTS)
    at.file_uploader(key="ckpt_zip").set_value(("tiny-llama.zip", data, "application/zip")).run()
    at.button(key="ckpt_zip_load").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Loaded" in s.value and "tiny-llama" in s.value for s in at.success)
    assert at.session_state["model"] == "tiny-llama"  # the page's rerun runs app.py, which makes it the sidebar's model
    registry = dict(at.session_state["models"])

    # AppTest's switch_page runs only the page script, not app.py, so open a session that starts with the
    # uploaded model chosen (the browser test drives the real switch through the sidebar).
    at = open_page(EXPLORE, models=registry, model="tiny-llama")
    assert any("llama decoder" in c.value for c in at.caption)
    titles = [s["layout"]["title"]["text"] for s in figures(at)]
    assert any("4 query heads share 2 K/V heads" in t for t in titles)  # GQA drawn
    assert replay_difference_shown(at) < 1e-5


def test_a_hostile_upload_is_refused_and_the_default_model_stays(tmp_path):
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("../../../etc/cron.d/evil", "* * * * * root rm -rf /")
        archive.writestr("config.json", "{}")
    at = open_page(CHECKPOINTS)
    at.file_uploader(key="ckpt_zip").set_value(("evil.zip", buffer.getvalue(), "application/zip")).run()
    at.button(key="ckpt_zip_load").click().run()
    assert not at.exception
    assert any("climbs out of its folder" in e.value for e in at.error)
    at.switch_page(EXPLORE).run()
    assert not at.exception and any("bert encoder" in c.value for c in at.caption)


def test_checkpoint_without_tokenizer_offers_a_marked_fallback(tmp_path):
    folder = make_tiny_checkpoint("gpt2", tmp_path / "no-tokenizer", with_tokenizer=False)
    at = open_page(EXPLORE, models={"all-MiniLM-L6-v2 (bundled BERT)": "unused", "bare": str(folder)}, model="bare")
    assert any("no tokenizer files" in w.value for w in at.warning)
    assert "split on whitespace" in " ".join(w.value for w in at.warning)
    whitespace_ticks = main_figure(at)["layout"]["xaxis"]["ticktext"]
    at.radio(key="fallback_tokenizer").set_value("bytes").run()
    assert not at.exception
    byte_ticks = main_figure(at)["layout"]["xaxis"]["ticktext"]
    assert len(byte_ticks) > len(whitespace_ticks) and byte_ticks[0] == "0 · T"


def test_presentation_mode_enlarges_figures():
    normal = main_figure(open_page(EXPLORE))
    large = main_figure(open_page(EXPLORE, presentation_mode=True))
    assert large["layout"]["height"] > normal["layout"]["height"]
    assert large["layout"]["font"]["size"] > 12


def test_encoder_decoder_model_shows_all_three_attention_kinds(tmp_path):
    folder = make_tiny_checkpoint("bart", tmp_path / "tiny-bart")
    at = open_page(EXPLORE, models={"all-MiniLM-L6-v2 (bundled BERT)": "unused", "tiny-bart": str(folder)},
                   model="tiny-bart")
    kinds = at.segmented_control(key="explore_kind")
    assert list(kinds.options) == ["encoder self-attention", "decoder self-attention (causal)",
                                   "cross-attention (decoder → encoder)"]
    at.text_input(key="explore_pair").input("a short target").run()
    kinds.set_value("cross").run()
    assert not at.exception
    spec = main_figure(at)
    assert "cross-attention" in spec["layout"]["title"]["text"]
    z = plotly_array(spec["data"][0]["z"])
    assert z.shape[0] < z.shape[1]  # decoder queries x encoder keys
    at.segmented_control(key="view").set_value("rollout").run()
    assert any("rollout needs square self-attention" in w.value for w in at.warning)
    at.segmented_control(key="explore_kind").set_value("decoder").run()
    z = plotly_array(main_figure(at)["data"][0]["z"])
    assert np.all(np.triu(z, 1) == 0)


def test_bertviz_tab_builds_its_view_on_request():
    at = open_page(EXPLORE)
    at.session_state["explore_tab"] = "bertviz (online)"
    at.run()
    assert any("needs internet" in i.value for i in at.info)
    at.button(key="explore_bertviz_build").click().run()
    assert not at.exception
    frames = at.get("iframe")
    assert frames and "require" in str(frames[0].proto)


def test_remove_an_uploaded_model(tmp_path):
    from pathlib import Path

    folder = make_tiny_checkpoint("gpt2", tmp_path / "tiny-gpt2")
    data = zip_folder(folder, tmp_path / "tiny-gpt2.zip").read_bytes()
    at = open_page(CHECKPOINTS)
    at.file_uploader(key="ckpt_zip").set_value(("tiny-gpt2.zip", data, "application/zip")).run()
    at.button(key="ckpt_zip_load").click().run()
    extracted = Path(at.session_state["models"]["tiny-gpt2"])
    assert extracted.is_dir()
    at.button(key="ckpt_remove_tiny-gpt2").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "tiny-gpt2" not in at.session_state["models"]
    assert not extracted.exists() and not extracted.parent.exists()  # the upload's temporary folder is gone
    assert at.session_state["model"] == "all-MiniLM-L6-v2 (bundled BERT)"


def test_load_a_folder_from_the_server_and_switch_it_off(tmp_path, monkeypatch):
    folder = make_tiny_checkpoint("bert", tmp_path / "local-bert")
    at = open_page(CHECKPOINTS)
    at.text_input(key="ckpt_folder").input(str(folder)).run()
    at.button(key="ckpt_folder_load").click().run()
    assert not at.exception
    assert at.session_state["models"]["local-bert"] == str(folder.resolve())
    assert folder.exists()  # a server folder is used in place, never deleted
    at.text_input(key="ckpt_folder").input(str(tmp_path / "missing")).run()
    at.button(key="ckpt_folder_load").click().run()
    assert any("does not exist" in e.value for e in at.error)

    monkeypatch.setenv("ATTNVIZ_SERVER_FOLDERS", "0")
    at = open_page(CHECKPOINTS)
    assert any("switched off" in i.value for i in at.info)
    assert not [w for w in at.text_input if w.key == "ckpt_folder"]


def test_a_second_checkpoint_with_the_same_name_gets_its_own(tmp_path):
    data = zip_folder(make_tiny_checkpoint("gpt2", tmp_path / "a" / "tiny-gpt2"), tmp_path / "a.zip").read_bytes()
    other = zip_folder(make_tiny_checkpoint("gpt2", tmp_path / "b" / "tiny-gpt2", seed=3), tmp_path / "b.zip")
    at = open_page(CHECKPOINTS)
    at.file_uploader(key="ckpt_zip").set_value(("tiny-gpt2.zip", data, "application/zip")).run()
    at.button(key="ckpt_zip_load").click().run()
    at.file_uploader(key="ckpt_zip").set_value(("tiny-gpt2.zip", other.read_bytes(), "application/zip")).run()
    at.button(key="ckpt_zip_load").click().run()
    assert not at.exception, [e.value for e in at.exception]
    names = [name for name in at.session_state["models"] if name.startswith("tiny-gpt2")]
    assert len(names) == 2 and at.session_state["models"][names[0]] != at.session_state["models"][names[1]]
    assert at.session_state["model"] == names[1]  # the second one becomes current, under its own name


def test_one_session_holds_at_most_four_uploads(tmp_path):
    from attnviz.ui.session_models import MAX_UPLOADED_MODELS as MAX_SESSION_UPLOADS

    at = open_page(CHECKPOINTS)
    for index in range(MAX_SESSION_UPLOADS + 1):
        folder = make_tiny_checkpoint("gpt2", tmp_path / f"tiny-{index}", seed=index)
        data = zip_folder(folder, tmp_path / f"tiny-{index}.zip").read_bytes()
        at.file_uploader(key="ckpt_zip").set_value((f"tiny-{index}.zip", data, "application/zip")).run()
        at.button(key="ckpt_zip_load").click().run()
    assert not at.exception, [e.value for e in at.exception]
    uploaded = [name for name in at.session_state["models"] if name.startswith("tiny-")]
    assert len(uploaded) == MAX_SESSION_UPLOADS and f"tiny-{MAX_SESSION_UPLOADS}" not in uploaded
    assert any("already holds 4 added models" in e.value for e in at.error)
    at.button(key="ckpt_remove_tiny-0").click().run()  # after a removal there is room again
    at.button(key="ckpt_zip_load").click().run()
    assert f"tiny-{MAX_SESSION_UPLOADS}" in at.session_state["models"]


def test_controls_appear_only_where_they_act_and_keep_their_values():
    at = open_page(EXPLORE)
    at.number_input(key="head").set_value(7).run()

    def shown(widget, key):
        return any(w.key == key for w in getattr(at, widget))

    assert shown("number_input", "layer") and shown("number_input", "head") and shown("selectbox", "explore_scale")
    assert not shown("multiselect", "explore_follow") and not shown("number_input", "explore_top_k")
    at.segmented_control(key="view").set_value("average").run()
    assert shown("number_input", "layer") and not shown("number_input", "head")
    at.segmented_control(key="view").set_value("rollout").run()
    assert not shown("number_input", "layer") and not shown("number_input", "head")
    assert at.number_input(key="explore_rollout_layer").value == 5  # the last layer, not a trivial layer 0
    assert "through layers 0..5" in main_figure(at)["layout"]["title"]["text"]
    at.number_input(key="explore_rollout_layer").set_value(2).run()
    assert "through layers 0..2" in main_figure(at)["layout"]["title"]["text"]
    at.segmented_control(key="view").set_value("lines").run()
    assert shown("multiselect", "explore_follow") and shown("number_input", "explore_top_k")
    at.number_input(key="explore_top_k").set_value(1).run()
    assert "strongest keys" in " ".join(c.value for c in at.caption)
    # The Head box draws the new head's lines (a single head drawn follows it; a new head joins several)
    at.number_input(key="head").set_value(4).run()
    assert at.multiselect(key="explore_line_heads").value == [4]
    assert "head 4" in main_figure(at)["layout"]["title"]["text"]
    at.multiselect(key="explore_line_heads").select(5).run()
    at.number_input(key="head").set_value(7).run()
    assert at.multiselect(key="explore_line_heads").value == [4, 5, 7]
    at.segmented_control(key="view").set_value("grid").run()
    assert shown("selectbox", "explore_grid_scale") and shown("toggle", "explore_hide_special")
    at.selectbox(key="explore_grid_scale").set_value("fixed").run()
    assert "weights on 0–1" in main_figure(at)["layout"]["title"]["text"]
    at.segmented_control(key="view").set_value("head").run()
    assert at.number_input(key="head").value == 7  # kept while the average and rollout views hid it
    assert main_figure(at)["layout"]["title"]["text"].startswith("Layer 0, head 7")


def test_the_sentence_pair_and_the_filters_are_kept_in_the_link():
    from streamlit.testing.v1 import AppTest


    at = AppTest.from_file(str(SCRIPT), default_timeout=120)
    at.query_params.update({"explore_pair": "It was tired.", "explore_block": "A→B",
                            "explore_hide_special": "true"})
    at.run()
    assert not at.exception
    assert at.text_input(key="explore_pair").value == "It was tired."
    title = main_figure(at)["layout"]["title"]["text"]
    assert "block A→B" in title and "special tokens hidden" in title


def test_head_statistics_map_and_label_filter():
    at = open_page(EXPLORE)
    at.session_state["explore_tab"] = "Head statistics"
    at.run()
    assert not at.exception
    spec = next(s for s in figures(at) if s["layout"]["title"]["text"] == "previous token of every head")
    assert plotly_array(spec["data"][0]["z"]).reshape(6, 12).shape == (6, 12)
    labels = at.multiselect(key="explore_stats_labels")
    first = labels.options[0] if hasattr(labels, "options") else labels.value[0]
    labels.set_value([first]).run()
    table = next(d for d in at.dataframe if "label" in d.value.columns)
    assert set(table.value["label"]) == {first} and len(table.value) < 72
    at.selectbox(key="explore_stats_map").set_value("entropy (nats)").run()
    assert any(s["layout"]["title"]["text"] == "entropy (nats) of every head" for s in figures(at))


def test_the_query_key_tab_shows_how_one_score_is_made():
    at = open_page(EXPLORE)
    at.session_state["explore_tab"] = "Q·K"
    at.run()
    assert not at.exception
    vectors = next(s for s in figures(at) if s["layout"]["title"]["text"].startswith("Layer 0, head 2: query 2"))
    assert plotly_array(vectors["data"][0]["z"]).reshape(3, -1).shape == (3, 32)
    assert at.selectbox(key="qk_key").value == 1  # the key the query "cat" attends to most: "the", before it
    at.selectbox(key="qk_key").set_value(5).run()
    caption = next(c.value for c in at.caption if c.value.startswith("q·k = Σ q∘k"))
    assert "5 · the" in caption


def test_replay_check_of_a_bf16_model_is_held_to_bf16_rounding_of_each_output(tmp_path):
    import torch
    from transformers import AutoModel

    from attnviz.models.shipped import bundled_models, default_model_dir

    source, folder = default_model_dir(), tmp_path / "bert-bf16"
    AutoModel.from_pretrained(source, dtype=torch.bfloat16).save_pretrained(folder)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).write_bytes((source / name).read_bytes())
    models = {name: str(path) for name, path in bundled_models().items()} | {"bert-bf16": str(folder)}
    at = open_page(EXPLORE, models=models, model="bert-bf16")
    check = next(m for m in at.markdown if "Replay check" in m.value)
    assert ":material/check_circle:" in check.value  # the real replay passes in bf16
    difference = replay_difference_shown(at)
    assert 0 < difference < 0.1  # bf16 does round (it is not exact), far less than a wrong scale moves it
    assert "bfloat16" in check.proto.help and "%" in check.proto.help
