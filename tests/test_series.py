"""A user's series of checkpoints measured over training (attnviz.corpus.series): each checkpoint's measures equal an
independent computation written here (transformers' own eager attention weights, the detectors' keys by hand, every
head ablated one forward at a time by a hook of this file, the losses by hand), a stopped run goes on to the same rows,
a finished one reopens without measuring (Ray gives the same rows: tests/test_series_scans.py), the tokenizer is found
in the series folder or in each checkpoint, the command line runs, and what cannot be a series is refused in words."""

import os
import shutil

import duckdb
import pytest
import torch

from attnviz.corpus.database import NotAResultsFile
from attnviz.corpus.series import folder as sfolder
from attnviz.corpus.series import probe as sprobe
from attnviz.corpus.series import runner as sr
from attnviz.corpus.series import store as sstore
from attnviz.interventions import training_measures as tm
from attnviz.models.shipped import BUNDLED_GPT_DIR, default_model_dir

STEPS = (100, 200, 300)
LAYERS, HEADS, WIDTH = 2, 2, 32
TOKENIZER = ("tokenizer.json", "tokenizer_config.json")  # the bundled tiny GPT's: 4,096 tokens, BOS 0


def save_gpt(folder, seed: int, *, layers: int = LAYERS, positions: int = 128):
    """A tiny GPT-2 with its LM head, of random weights (a wide initialisation, so its heads attend unevenly)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=4096, n_positions=positions, n_layer=layers, n_head=HEADS, n_embd=WIDTH,
                        initializer_range=0.3, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def copy_tokenizer(folder, source=BUNDLED_GPT_DIR):
    for name in TOKENIZER:
        shutil.copy(source / name, folder / name)


def make_series(root, steps=STEPS):
    """``root``: one tiny GPT-2 per step (``step100/``, ..., different weights) and the tokenizer once beside them."""
    for seed, step in enumerate(steps):
        save_gpt(root / f"step{step}", seed)
    copy_tokenizer(root)
    return root


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread for the module (the tests measure tiny models; other workers share the cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """step100/, step200/, step300/ (different weights) and the tokenizer once, in the series folder."""
    return make_series(tmp_path_factory.mktemp("series"))


@pytest.fixture(scope="module")
def measured(series, tmp_path_factory):
    """The series measured in one run, in-process."""
    path = tmp_path_factory.mktemp("measured") / "series.duckdb"
    seen = []
    state = sr.run_series(series, path, progress=lambda s: seen.append((s.done, s.step)))
    assert state.status == sstore.STATUS_FINISHED and state.done == state.planned == 3
    assert seen[0] == (0, None) and [done for done, _ in seen[1:4]] == [1, 2, 3]
    assert [step for _, step in seen[1:4]] == list(STEPS)  # one checkpoint at a time, ascending
    return path


def rows_of(path) -> list[dict]:
    return sstore.open_series(path).rows


def assert_same_rows(found: list[dict], expected: list[dict], rel: float = 1e-9, abs_: float = 1e-12) -> None:
    assert [row["step"] for row in found] == [row["step"] for row in expected]
    for a, b in zip(found, expected, strict=True):
        assert set(a) == set(b)
        for name in b:
            if isinstance(b[name], list):
                assert torch.tensor(a[name]).double() == pytest.approx(torch.tensor(b[name]).double(), rel=rel,
                                                                        abs=abs_), name
            else:
                assert a[name] == pytest.approx(b[name], rel=rel, abs=abs_), name


# -- the measures, computed independently ---------------------------------------------------------------------------
def token_losses(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """By hand: -log p(token t | tokens before t) for t = 1 .. n - 1, ``[rows, n - 1]``."""
    logp = logits.double().log_softmax(-1)
    return -logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]


def hand_targets(tokens: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The duplicate-token and induction detectors' keys, written out: query i looks at each earlier key j with the
    same token (duplicate), and at the key right after it, j + 1 (induction); the BOS (before ``start``) is neither
    a query nor a key."""
    n = len(tokens)
    duplicate = torch.zeros(n, n, dtype=torch.bool)
    induction = torch.zeros(n, n, dtype=torch.bool)
    for query in range(start, n):
        for key in range(start, query):
            if tokens[key] == tokens[query]:
                duplicate[query, key] = True
                induction[query, key + 1] = True
    return duplicate, induction


def mean_on(weights: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """Per head, the weight on the targets summed per query, averaged over the queries that have a target."""
    out = []
    for head in range(weights.shape[0]):
        per_query = [float((weights[head, query].double() * targets[query]).sum()) for query in range(len(targets))
                     if targets[query].any()]
        out.append(sum(per_query) / len(per_query))
    return out


def independent_measures(folder, probe: tm.Probe) -> dict:
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").float().eval()
    held, repeated, start, period = probe.held_out, probe.repeated, probe.start, probe.period
    with torch.no_grad():
        out = model(input_ids=held, output_attentions=True)
        assert len(out.attentions) == LAYERS
        losses = token_losses(out.logits, held)  # column c: the loss of token c + 1
        early = losses[:, tm.EARLY[0] - 1 : tm.EARLY[1] - 1].mean()
        late = losses[:, tm.LATE[0] - 1 : tm.LATE[1] - 1].mean()
        n = held.shape[1]
        previous = [[sum(float(out.attentions[layer][w, head, i, i - 1]) for w in range(len(held)) for i in range(1, n))
                     / (len(held) * (n - 1)) for head in range(HEADS)] for layer in range(LAYERS)]
        again = model(input_ids=repeated, output_attentions=True)
        induction = torch.zeros(LAYERS, HEADS, dtype=torch.float64)
        duplicate = torch.zeros(LAYERS, HEADS, dtype=torch.float64)
        for row in range(len(repeated)):
            dup, ind = hand_targets(repeated[row].tolist(), start)
            for layer in range(LAYERS):
                induction[layer] += torch.tensor(mean_on(again.attentions[layer][row], ind))
                duplicate[layer] += torch.tensor(mean_on(again.attentions[layer][row], dup))
        second = list(range(start + period + 1, start + 2 * period))  # the second copy's tokens after its first

        def copy_loss(logits) -> float:
            return float(token_losses(logits, repeated)[:, [t - 1 for t in second]].mean())

        clean = copy_loss(again.logits)
        costs = torch.zeros(LAYERS, HEADS, dtype=torch.float64)
        for layer in range(LAYERS):
            for head in range(HEADS):
                def zero_head(_, arguments, head=head):
                    merged = arguments[0].clone()  # [rows, n, heads * head width]: the heads side by side
                    merged[..., head * (WIDTH // HEADS) : (head + 1) * (WIDTH // HEADS)] = 0
                    return (merged,)

                handle = model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(zero_head)
                try:
                    costs[layer, head] = copy_loss(model(input_ids=repeated).logits) - clean
                finally:
                    handle.remove()
    return {"loss": float(losses.mean()), "early_loss": float(early), "late_loss": float(late),
            "icl": float(late - early), "copy_loss": clean, "previous_token": previous,
            "induction": (induction / len(repeated)).tolist(), "duplicate_token": (duplicate / len(repeated)).tolist(),
            "ablation_cost": costs.tolist()}


def test_each_checkpoints_measures_equal_an_independent_computation(series, measured):
    from transformers import AutoTokenizer

    from attnviz.tiny_gpt.text import HELD_OUT_SHARE, documentation_text, split_text

    run = sstore.open_series(measured)
    assert run.steps == list(STEPS) and run.checkpoints == {step: series / f"step{step}" for step in STEPS}
    assert run.facts["status"] == "finished" and run.facts["layers"] == LAYERS and run.facts["heads"] == HEADS
    assert run.facts["tokenizer_from"] == "the series folder"
    assert run.phase == tm.phase_change(run.steps, [row["induction"] for row in run.rows])
    # the probe: 16 evenly spaced windows of 128 tokens of the held-out documentation, and random ordinary tokens
    # typed twice after the BOS
    tokenizer = AutoTokenizer.from_pretrained(series)
    ids = tokenizer(split_text(documentation_text(), HELD_OUT_SHARE)[1], add_special_tokens=False)["input_ids"]
    found = sfolder.find_series(series)
    probe = sprobe.series_probe(sfolder.series_tokenizer(found), sprobe.probe_text(None), sr.DEFAULT_SETTINGS,
                                found.shape)
    assert probe.held_out.shape == (16, 128) and probe.held_out[0].tolist() == ids[:128]
    assert probe.held_out[-1].tolist() == ids[len(ids) - 129 : len(ids) - 1]
    assert probe.repeated.shape == (8, 81) and probe.start == 1 and (probe.repeated[:, 0] == 0).all()
    assert torch.equal(probe.repeated[:, 1:41], probe.repeated[:, 41:]) and (probe.repeated[:, 1:] != 0).all()
    for row in run.rows[:2]:  # two of the three: each is the same computation
        expected = independent_measures(series / f"step{row['step']}", probe)
        for name, value in expected.items():
            got = torch.tensor(row[name], dtype=torch.float64)
            assert got == pytest.approx(torch.tensor(value, dtype=torch.float64), rel=1e-6, abs=1e-6), \
                (row["step"], name)
    assert run.rows[0]["loss"] != run.rows[1]["loss"]  # different weights, different measures


def test_the_database_holds_one_row_per_step_and_per_step_and_head(measured):
    with duckdb.connect(str(measured), read_only=True) as connection:
        steps = connection.execute("SELECT step, name, loss, load_seconds FROM steps ORDER BY step").fetchall()
        heads = connection.execute("SELECT step, layer, head, induction FROM head_scores ORDER BY ALL").fetchall()
    assert [(step, name) for step, name, _, _ in steps] == [(step, f"step{step}") for step in STEPS]
    assert all(seconds > 0 for *_, seconds in steps)
    assert [row[:3] for row in heads] == [(s, layer, head) for s in STEPS for layer in range(LAYERS)
                                          for head in range(HEADS)]
    run = sstore.open_series(measured)
    assert heads[LAYERS * HEADS + 3][3] == pytest.approx(run.rows[1]["induction"][1][1])


def test_a_stopped_run_goes_on_to_the_same_rows_and_a_finished_one_reopens_without_measuring(series, measured,
                                                                                                tmp_path):
    path = tmp_path / "stopped.duckdb"
    asked = []

    def stop_after_the_first() -> bool:
        asked.append(1)
        return len(asked) > 1  # asked before each checkpoint: the second is not begun

    state = sr.run_series(series, path, should_stop=stop_after_the_first)
    assert state.status == sstore.STATUS_STOPPED and state.done == 1 and state.planned == 3
    stopped = sstore.open_series(path)
    assert stopped.steps == [100] and stopped.facts["status"] == "stopped"
    state = sr.run_series(series, path)
    assert state.status == sstore.STATUS_FINISHED and state.done_this_run == 2 and not state.finished_before
    assert_same_rows(rows_of(path), rows_of(measured))
    again = sr.run_series(series, path)
    assert again.finished_before and again.done_this_run == 0 and again.status == sstore.STATUS_FINISHED


def test_the_tokenizer_in_each_checkpoint_and_the_command_line(series, measured, tmp_path):
    """Each checkpoint with its own tokenizer (none in the series folder) gives the same rows, measured by ``attnviz
    series``; a checkpoint added later is measured when the run goes on, the others are not measured again."""
    from attnviz.app.command import main

    each = tmp_path / "each"
    for step in STEPS:
        shutil.copytree(series / f"step{step}", each / f"checkpoint-{step}")
        copy_tokenizer(each / f"checkpoint-{step}")
    path = tmp_path / "each.duckdb"
    assert main(["series", str(each), "--db", str(path), "--quiet"]) == 0
    run = sstore.open_series(path)
    assert run.facts["tokenizer_from"] == "step 300 (checkpoint-300)"
    assert_same_rows(run.rows, rows_of(measured), rel=1e-6, abs_=1e-9)
    save_gpt(each / "checkpoint-400", 7)
    copy_tokenizer(each / "checkpoint-400")
    state = sr.run_series(each, path)
    assert state.done_this_run == 1 and sstore.open_series(path).steps == [*STEPS, 400]


# -- finding the series, and refusals -------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "step"), [("step1000", 1000), ("checkpoint-500", 500), ("ckpt_step_1200", 1200),
                                            ("run-step=300", 300), ("epoch2-step1500", 1500), ("global_step7", 7),
                                            ("model-v2-0042", 42), ("final", None)])
def test_a_checkpoints_step_is_read_from_its_folders_name(name, step):
    assert sfolder.step_of(name) == step


def a_copy(series, tmp_path, steps=STEPS, names=None):
    root = tmp_path / "copy"
    for step, name in zip(steps, names or [f"step{step}" for step in steps], strict=True):
        shutil.copytree(series / f"step{step}", root / name)
    copy_tokenizer(root)
    return root


def refused(folder, match: str) -> None:
    with pytest.raises(sfolder.SeriesRefused, match=match):
        sfolder.series_tokenizer(sfolder.find_series(folder))


def test_names_without_a_step_and_two_checkpoints_of_one_step_are_refused(series, tmp_path):
    root = a_copy(series, tmp_path)
    (root / "logs").mkdir()  # a folder without config.json is passed over
    assert sfolder.find_series(root).steps == list(STEPS)
    shutil.copytree(root / "step100", root / "final")
    refused(root, "final holds a checkpoint, but its name has no step number")
    shutil.move(root / "final", root / "checkpoint-100")
    refused(root, "checkpoint-100 and step100 both name step 100")


def test_empty_folders_one_checkpoint_and_too_many_are_refused(series, tmp_path):
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", "no checkpoint found")
    refused(series / "step100", "it is one checkpoint, not a series")
    with pytest.raises(sfolder.SeriesRefused, match="it holds 3 checkpoints; a series is measured on at most 2"):
        sfolder.find_series(series, most=2)


def test_a_link_out_of_the_series_and_a_pickle_only_checkpoint_are_refused(series, tmp_path):
    root = a_copy(series, tmp_path)
    elsewhere = tmp_path / "elsewhere" / "step900"
    shutil.copytree(series / "step100", elsewhere)
    os.symlink(elsewhere, root / "step900")
    refused(root, "step900 is a link that leads out of the series folder")
    (root / "step900").unlink()
    pickled = root / "step400"
    pickled.mkdir()
    shutil.copy(series / "step100" / "config.json", pickled / "config.json")
    torch.save({"weights": torch.zeros(2)}, pickled / "pytorch_model.bin")
    refused(root, r"step 400 \(step400\) cannot be used: the weights are in pickle format")


def test_other_vocabularies_shapes_encoders_and_short_contexts_are_refused_naming_the_step(series, tmp_path):
    from tests.tiny_models import make_tiny_checkpoint

    root = a_copy(series, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):  # the bundled BERT's: another vocabulary
        shutil.copy(default_model_dir() / name, root / "step300" / name)
    refused(root, r"step 300 \(step300\) has a tokenizer with another vocabulary than the series folder's")
    shutil.rmtree(root / "step300")
    save_gpt(root / "step300", 3, layers=3)
    refused(root, r"step 300 \(step300\) has layers 3, step 100 \(step100\) has 2: the checkpoints of a series share")
    shutil.rmtree(root / "step300")
    make_tiny_checkpoint("bert", root / "step300", with_tokenizer=False)
    refused(root, r"step 300 \(step300\) is an encoder \(bert\): a series is measured on decoders")
    short = tmp_path / "short"
    for step in STEPS:
        save_gpt(short / f"step{step}", step, positions=64)
    copy_tokenizer(short)
    found = sfolder.find_series(short)
    with pytest.raises(sfolder.SeriesRefused, match="the checkpoints read at most 64 positions: the measures need 128"):
        sprobe.series_probe(sfolder.series_tokenizer(found), sprobe.probe_text(None), sr.DEFAULT_SETTINGS, found.shape)


def test_no_tokenizer_anywhere_is_refused_and_another_series_file_is_not_added_to(series, measured, tmp_path):
    bare = tmp_path / "bare"
    for step in STEPS:
        shutil.copytree(series / f"step{step}", bare / f"step{step}")
    refused(bare, "no tokenizer found: put the tokenizer's files")
    copy_tokenizer(bare)
    copied = tmp_path / "copied.duckdb"
    shutil.copy(measured, copied)
    with pytest.raises(sfolder.SeriesRefused, match="holds another series"):
        sr.run_series(bare, copied)  # another folder: never added to the first series' file


def test_a_file_that_is_not_a_series_database_is_not_read(measured, tmp_path):
    hostile = tmp_path / "hostile.duckdb"
    shutil.copy(measured, hostile)
    with duckdb.connect(str(hostile)) as connection:
        connection.execute("CREATE VIEW leak AS SELECT 1 AS x")
    with pytest.raises(NotAResultsFile, match="view main.leak"):
        sstore.open_series(hostile)
    missing = tmp_path / "missing.duckdb"
    shutil.copy(measured, missing)
    with duckdb.connect(str(missing)) as connection:
        connection.execute("DELETE FROM head_scores WHERE step = 200 AND head = 1")
    with pytest.raises(NotAResultsFile, match="not one row per step, layer and head"):
        sstore.open_series(missing)


def test_the_notebook_api_reopens_a_measured_series_and_refuses_unknown_settings(series, measured, tmp_path):
    import attnviz
    from attnviz.corpus.options import SettingsRefused

    copied = tmp_path / "copied.duckdb"
    shutil.copy(measured, copied)
    run = attnviz.measure_series(series, copied, progress=False)  # finished: reopened, nothing measured again
    assert_same_rows(run.rows, rows_of(measured), rel=0, abs_=0)
    assert attnviz.open_series(copied).steps == list(STEPS)
    with pytest.raises(SettingsRefused, match="'periods': no setting of that name"):
        attnviz.measure_series(series, tmp_path / "x.duckdb", progress=False, periods=3)
