"""The "Over training" page as a user sees it (AppTest): a run laid out as the bundled tiny GPT's own (made here, see
tests/fake_training_runs.py) drawn with its words, the step slider's numbers, and the buttons that open a kept
checkpoint in Explore heads and Generation; and the run the package ships, when it ships one."""

import pytest

from attnviz.interventions.training_runs import bundled_run
from attnviz.pagelogic import over_training as ot
from attnviz.ui import over_training_view as view
from tests.apptest_helpers import assert_no_failure, figure_titled, open_page, plotly_array
from tests.fake_training_runs import STEPS, make_run_folder

PAGE = "app_pages/over_training.py"


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    return make_run_folder(tmp_path_factory.mktemp("over-training") / "tiny-gpt")


@pytest.fixture
def fake_run(run_folder, monkeypatch, clean_streamlit_caches):
    """The page reads the run made here as the bundled one."""
    monkeypatch.setattr(view, "BUNDLED_RUN_FOLDER", run_folder)
    return bundled_run(run_folder)


def _metrics(at) -> dict[str, str]:
    return {metric.label: metric.value for metric in at.metric}


def test_the_page_draws_the_run_with_its_words_and_a_step_s_numbers(fake_run):
    at = open_page(PAGE)
    assert_no_failure(at)
    assert at.select_slider(key="ot_step").value == 400  # the end of the phase change
    said = " ".join(markdown.value for markdown in at.markdown)
    assert "**The phase change falls between step 100 and step 400**" in said
    assert "**L1 H1** from 0.02 at step 100 to 0.7 at step 400" in said
    loss = figure_titled(at, "Held-out loss and in-context learning")
    assert loss["layout"]["xaxis2"]["type"] == "log"
    assert [shape["x0"] for shape in loss["layout"]["shapes"] if shape["type"] == "rect"] == [100, 100]
    heads = figure_titled(at, "Every head over training")
    assert len(heads["data"]) == 4 * 3  # four measures: the other heads' lines, then each named head's
    assert [trace["name"] for trace in heads["data"] if trace.get("showlegend")] == ["L1 H1", "L0 H0"]
    row = fake_run.rows[STEPS.index(400)]
    assert _metrics(at)["Held-out loss"] == ot.step_numbers(fake_run, 400).loss == f"{row['loss']:.2f}"
    assert any("The buttons open the checkpoint kept at step 400" in caption.value for caption in at.caption)

    at.select_slider(key="ot_step").set_value(10).run()
    assert_no_failure(at)
    numbers = ot.step_numbers(fake_run, 10)
    assert _metrics(at) == {"Held-out loss": numbers.loss, "In-context-learning score": numbers.icl,
                            "Second copy's loss": numbers.copy_loss, "Highest induction score": numbers.best_induction}
    assert _metrics(at)["Held-out loss"] != ot.step_numbers(fake_run, 400).loss
    table = at.dataframe[0].value
    assert table.loc[3, "induction score"] == pytest.approx(0.03)  # L1 H1 at step 10
    marked = [shape["x0"] for shape in figure_titled(at, "Every head")["layout"]["shapes"] if shape["type"] == "line"]
    assert set(marked) == {10}
    assert any("the buttons open **step 100**, the nearest to step 10" in caption.value for caption in at.caption)

    at.segmented_control(key="ot_source").set_value("series").run()  # the other source: its own controls, no failure
    assert_no_failure(at)


def test_the_buttons_open_the_nearest_kept_checkpoint_on_a_repeated_sentence(fake_run):
    """Explore heads on the snapshot nearest the step, registered as a model of the session, at the induction head;
    then Generation on the last step, whose folder the session already has under another name (not registered
    again)."""
    at = open_page(PAGE)
    at.select_slider(key="ot_step").set_value(10).run()  # the nearest kept checkpoint: step 100
    at.button(key="ot_explore").click().run()
    assert_no_failure(at)
    name = "tiny GPT at step 100 (bundled run)"
    assert at.session_state["models"][name] == str(fake_run.checkpoints[100])
    assert at.session_state["model"] == name and at.session_state["sentence"] == ot.REPEATED_SENTENCE
    assert (at.session_state["layer"], at.session_state["head"]) == (1, 1)  # the induction head the words name
    assert at.title[0].value == "Explore heads"

    at.session_state["models"]["my copy"] = str(fake_run.checkpoints[1000])  # the last step: the model folder itself
    at.switch_page(PAGE).run()
    at.select_slider(key="ot_step").set_value(1000).run()
    at.button(key="ot_generation").click().run()
    assert_no_failure(at)
    assert at.session_state["model"] == "my copy"  # reused, not registered again
    assert [model for model in at.session_state["models"] if model.startswith("tiny GPT at step")] == [name]
    assert at.session_state["gen_request"]["prompt"] == ot.REPEATED_SENTENCE
    assert at.title[0].value == "Generation and KV cache"


def test_without_a_record_the_page_says_how_to_make_one(tmp_path, monkeypatch, clean_streamlit_caches):
    monkeypatch.setattr(view, "BUNDLED_RUN_FOLDER", tmp_path)
    at = open_page(PAGE)
    assert_no_failure(at)
    assert any("attnviz train-tiny" in info.value for info in at.info)


def test_the_shipped_run_is_drawn_where_the_package_has_one(clean_streamlit_caches):
    run = bundled_run()
    if run is None:
        pytest.skip("the bundled tiny GPT ships no over-training record")
    at = open_page(PAGE)
    assert_no_failure(at)
    assert at.select_slider(key="ot_step").value == ot.default_step(run)
    said = " ".join(markdown.value for markdown in at.markdown)
    assert ot.phase_words(run) in said and ot.induction_words(run) in said
    loss = figure_titled(at, "Held-out loss and in-context learning")
    assert list(plotly_array(loss["data"][0]["customdata"])) == run.steps
