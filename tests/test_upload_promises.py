"""The promises docs/deployment.md makes for a shared server, each checked where the hostile-input suite cannot:
refusals that reveal nothing about the disk, disk bounds with several browsers at once, a load that says what
it waits for, and NaN named on the pages."""

import json
import math
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from attnviz.app import SCRIPT
from attnviz.checkpoints import disk, keep, preflight
from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.checkpoints.uploads import prepare_folder_path, prepare_zip
from attnviz.models.capture import capture
from attnviz.models.loading import LOADING, load_model_dir
from attnviz.models.replay_check import replay_difference
from tests.tiny_models import make_tiny_checkpoint, zip_folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_checkpoint("gpt2", tmp_path_factory.mktemp("promises") / "tiny-gpt2")


@pytest.fixture
def own_temporary(tmp_path, monkeypatch):
    """Uploads of this test only: a temporary folder (and so an uploads root) and a keep root of its own (both
    count against ATTNVIZ_UPLOADS_GB)."""
    folder = tmp_path / "temporary"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("ATTNVIZ_KEEP_DIR", str(tmp_path / "kept"))
    return folder


def _with_index(tiny: Path, folder: Path, shard_name: str) -> Path:
    shutil.copytree(tiny, folder)
    (folder / "model.safetensors").rename(folder / "model-1.safetensors")
    from safetensors import safe_open

    with safe_open(str(folder / "model-1.safetensors"), "pt") as handle:
        names = list(handle.keys())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {name: shard_name for name in names}}))
    return folder


def test_a_refusal_is_the_same_whether_a_path_outside_exists_or_not(tiny, tmp_path):
    """The index is refused on the name it holds, before anything is looked up: the message for an existing file
    outside and for a missing one differ only by the name the checkpoint itself gave."""
    outside = tmp_path / "outside.safetensors"
    shutil.copy(tiny / "model.safetensors", outside)
    messages = []
    for index, target in enumerate([str(outside), str(tmp_path / "missing.safetensors"), "../outside.safetensors",
                                    "../missing.safetensors"]):
        folder = _with_index(tiny, tmp_path / f"m{index}", target)
        with pytest.raises(CheckpointRefused) as refused:
            load_model_dir(folder)
        messages.append(str(refused.value).replace(preflight.shown(target), "NAME"))
    assert len(set(messages)) == 1, messages


def test_a_plain_shard_name_loads_and_transformers_sees_only_the_checked_files(tiny, tmp_path):
    folder = _with_index(tiny, tmp_path / "sharded", "model-1.safetensors")
    (folder / "pytorch_model.bin").write_bytes(b"not read")  # transformers never sees it: not in the view
    (folder / "stray.safetensors").write_bytes(b"not read either")
    checked = preflight.inspect(folder, preflight.LinkRule(allowed=False))
    assert [f.name for f in checked.weights] == ["model-1.safetensors"]
    view = preflight.make_view(checked)
    try:
        assert "pytorch_model.bin" not in {p.name for p in view.iterdir()}
        assert "stray.safetensors" not in {p.name for p in view.iterdir()}
    finally:
        preflight.remove_view(view)
    bundle = load_model_dir(folder)
    assert bundle.n_parameters == checked.parameters


def test_config_numbers_are_refused_before_anything_is_built(tiny, tmp_path, monkeypatch):
    """The refusal comes from the JSON alone: transformers is never asked to build a skeleton."""
    import transformers

    def never(*args, **kwargs):
        raise AssertionError("a model was built for a config that the numbers refuse")

    monkeypatch.setattr(transformers.AutoModel, "from_config", never)
    config = json.loads((tiny / "config.json").read_text())
    for change, words in [({"n_layer": 10**6}, "layers"), ({"n_head": -4}, "heads"), ({"n_layer": 20}, "tensors"),
                          ({"text_config": {"num_hidden_layers": 10**5}}, "text_config"),
                          ({"n_embd": 8192, "n_head": 64}, "hold only")]:
        folder = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
        shutil.copytree(tiny, folder)
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        started = time.perf_counter()
        with pytest.raises(CheckpointRefused, match=words):
            load_model_dir(folder)
        assert time.perf_counter() - started < 2.0


def test_a_load_waiting_for_another_says_so(tiny):
    """A load that finds LOADING held reports the wait every second, then loads."""
    said: list[str] = []
    held = threading.Event()

    def hold():
        with LOADING:
            held.set()
            time.sleep(2.5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    bundle = load_model_dir(tiny, progress=said.append)
    holder.join()
    assert any(text.startswith("Waiting for another model to finish loading") for text in said), said
    assert said[0] == "Checking the files…" and "Reading the weights…" in said
    assert bundle.model_type == "gpt2"


def _zip(tiny: Path, tmp_path: Path) -> bytes:
    return zip_folder(tiny, tmp_path / "tiny.zip").read_bytes()


def test_three_browsers_at_once_with_room_for_one_upload(tiny, tmp_path, own_temporary, monkeypatch):
    """ATTNVIZ_UPLOADS_GB bounds every upload together, and the check and the reservation are one step: three
    uploads started at once, with room for one, give one upload and two refusals naming the limit."""
    data = _zip(tiny, tmp_path)
    size = sum(p.stat().st_size for p in tiny.iterdir())
    monkeypatch.setenv("ATTNVIZ_UPLOADS_GB", str(1.5 * size / 1024**3))
    start = threading.Barrier(3)
    outcomes = []

    def upload():
        start.wait()
        try:
            outcomes.append(prepare_zip(data, "tiny.zip")[0])
        except CheckpointRefused as refused:
            outcomes.append(str(refused))

    threads = [threading.Thread(target=upload) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    folders = [o for o in outcomes if isinstance(o, Path)]
    assert len(folders) == 1, outcomes
    assert all("space for uploads is full" in o for o in outcomes if isinstance(o, str))
    # A session-only upload counts too: while it is there, nothing else fits; once removed, another does.
    with pytest.raises(CheckpointRefused, match="space for uploads is full"):
        prepare_zip(data, "tiny.zip")
    shutil.rmtree(folders[0].parent)
    assert prepare_zip(data, "tiny.zip")[0].is_dir()


def test_three_browsers_keeping_at_once_with_room_for_one(tiny, tmp_path, own_temporary, monkeypatch):
    """ATTNVIZ_KEEP_GB is checked and the upload moved under one lock: three browsers keeping at once, with room
    for one, keep one; the others' uploads stay with their sessions."""
    data = _zip(tiny, tmp_path)
    kept_root = tmp_path / "kept"
    uploads = [prepare_zip(data, "tiny.zip")[0] for _ in range(3)]
    monkeypatch.setenv("ATTNVIZ_KEEP_GB", str(1.5 * disk.folder_bytes(uploads[0]) / 1024**3))
    start = threading.Barrier(3)
    moved = []

    def adopt(folder):
        store = keep.BrowserStore(keep.new_key(), kept_root)
        start.wait()
        moved.append(store.adopt_upload(folder))

    threads = [threading.Thread(target=adopt, args=(folder,)) for folder in uploads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(m is not None for m in moved) == 1, moved
    assert keep.root_bytes(kept_root) <= keep.keep_limit_bytes()
    assert sum(folder.exists() for folder in uploads) == 2  # the two not kept are where they were


def test_only_what_a_model_needs_is_written(tiny, tmp_path, own_temporary):
    files = {p.name: p.read_bytes() for p in tiny.iterdir()}
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(f"wrapper/{name}", data)
        archive.writestr("wrapper/README.md", b"\0" * (8 * 1024**2))
        archive.writestr("wrapper/optimizer.pt", b"\0" * 1024)
        archive.writestr("wrapper/extra.safetensors", files["model.safetensors"])
        archive.writestr("notes/big.txt", b"\0" * 1024)
    folder, _, notes = prepare_zip(buffer.getvalue(), "extracted.zip")
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    joined = " ".join(notes)
    assert "README.md (not a file the model needs)" in joined and "optimizer.pt (pickle format" in joined
    assert "extra.safetensors" in joined and "big.txt (outside the model's folder)" in joined


def test_a_nul_in_a_typed_folder_is_refused_in_words(tmp_path):
    with pytest.raises(CheckpointRefused, match="control characters"):
        prepare_folder_path(str(tmp_path) + "\0/etc")


def _overflowing(tiny: Path, tmp_path: Path) -> Path:
    """The tiny GPT-2 with query/key/value weights of 1e38: finite weights whose attention overflows."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "overflow"
    shutil.copytree(tiny, folder)
    weights = load_file(folder / "model.safetensors")
    name = next(n for n in weights if n.endswith("attn.c_attn.weight"))
    weights[name] = torch.full_like(weights[name], 1e38)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_nan_is_named_and_never_compared_as_exact(tiny, tmp_path):
    """Finite weights that overflow: the capture names what is not finite, the replay check returns NaN (never
    0.0, "exactly"), and the load marks the model."""
    bundle = load_model_dir(_overflowing(tiny, tmp_path))
    assert bundle.nonfinite == [] and bundle.nonfinite_outputs  # the weights are finite; what they give is not
    captured = capture(bundle, "The cat sat on the mat.")
    assert any("queries" in part or "outputs" in part for part in captured.nonfinite), captured.nonfinite
    assert math.isnan(replay_difference(captured.records["self"]))
    model = load_model_dir(tiny)
    healthy = capture(model, "The cat sat on the mat.")
    assert healthy.nonfinite == [] and replay_difference(healthy.records["self"]) < 1e-5


def _overflowing_zip(tiny: Path, tmp_path: Path) -> bytes:
    return zip_folder(_overflowing(tiny, tmp_path), tmp_path / "overflow.zip").read_bytes()


def test_the_pages_say_not_finite(tiny, tmp_path, clean_streamlit_caches):
    """Uploaded, the overflowing model is marked on the Checkpoints page; Explore heads warns in words and its
    replay check says "not finite", never "exactly"; a mechanism page warns too."""
    from tests.apptest_helpers import open_page

    at = open_page("app_pages/checkpoints.py", browser_key=keep.new_key())
    at.file_uploader(key="ckpt_zip").set_value(("overflow.zip", _overflowing_zip(tiny, tmp_path),
                                                "application/zip")).run()
    at.button(key="ckpt_zip_load").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Not finite" in w.value for w in at.warning), [w.value for w in at.warning]
    models = dict(at.session_state["models"])
    at = open_page("app_pages/explore_heads.py", models=models, model="overflow")  # the sidebar's choice
    assert not at.exception, [e.value for e in at.exception]
    assert any("Not finite" in w.value for w in at.warning), [w.value for w in at.warning]
    replay = [m.value for m in at.markdown if "Replay check" in m.value]
    assert replay and "not finite" in replay[0] and "exactly" not in replay[0], replay
    at.switch_page("app_pages/scaling.py").run()
    assert not at.exception and any("Not finite" in w.value for w in at.warning)


def test_an_unexpected_error_becomes_a_message_not_a_traceback(monkeypatch, clean_streamlit_caches):
    """The last line of defence in app.py: with strict errors off (as on a server), an exception no page caught is
    said in words; with them on (the tests), it fails loudly. (Explore heads, the default page, runs inside app.py
    in AppTest; a page opened with switch_page runs alone there.)"""
    from streamlit.testing.v1 import AppTest

    from attnviz.pagelogic.explore_heads import views

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setenv("ATTNVIZ_STRICT_ERRORS", "0")
    monkeypatch.setattr(views, "view_figure", broken)  # the page imports it from there
    at = AppTest.from_file(str(SCRIPT), default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Something went wrong on this page (KeyError: 'a bug')" in e.value for e in at.error), (
        [e.value for e in at.error])
    monkeypatch.setenv("ATTNVIZ_STRICT_ERRORS", "1")
    at.run()
    assert at.exception


def test_token_ids_past_the_embeddings_are_refused_in_words(tmp_path):
    """A tokenizer that does not fit its model: the load falls back to the stand-in, and capture, given such a
    tokenizer anyway, refuses in words instead of indexing past the embedding table."""
    import dataclasses

    from transformers import GPT2Config

    folder = make_tiny_checkpoint("gpt2", tmp_path / "small-vocab", config=GPT2Config(
        vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=4))
    bundle = load_model_dir(folder)
    assert bundle.uses_fallback_tokenizer and "token ids up to" in bundle.tokenizer_note
    from attnviz.models.text_tokenizers import tokenizer_of

    mismatched = dataclasses.replace(bundle, tokenizer=tokenizer_of(folder))
    with pytest.raises(ValueError, match="does not fit it"):
        capture(mismatched, "The cat sat on the mat.")
    assert capture(bundle, "The cat sat on the mat.").tokens  # the stand-in's ids are the model's
