"""Files an attacker would craft, through the same paths an upload takes: each is refused (or loaded and warned
about) with a clear message, the loaded models stay usable, and nothing is left on disk."""

import io
import json
import shutil
import struct
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch

from attnviz.checkpoints import preflight
from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.checkpoints.uploads import prepare_folder_path, prepare_single_files, prepare_zip
from attnviz.models.capture import capture
from attnviz.models.loading import load_model_dir
from attnviz.models.replay_check import replay_difference
from tests.tiny_models import bundled_bert, make_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_checkpoint("gpt2", tmp_path_factory.mktemp("hostile") / "tiny-gpt2")


@pytest.fixture
def no_leftovers(tmp_path, monkeypatch):
    """Uploads go to a temporary folder of the test's own; it must be empty again afterwards."""
    root = tmp_path / "uploads"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    assert leftovers(root) == []


def leftovers(temporary: Path) -> list[str]:
    """What uploads left in a temporary folder: workspaces, reservations, or views of files that are gone (the
    uploads root, its lock, and the views of models still loaded, such as the page's bundled ones, stay)."""
    import gc

    gc.collect()  # a view goes with its model
    found = [p.name for p in temporary.iterdir() if not p.name.startswith("attnviz-uploads-")]
    for root in temporary.glob("attnviz-uploads-*"):
        for entry in root.iterdir():
            live_view = entry.name.startswith("attnviz-upload-view-") and all(p.exists() for p in entry.iterdir())
            if entry.name not in (".lock", ".reservations") and not live_view:
                found.append(entry.name)
        found += [p.name for p in (root / ".reservations").glob("*")]
    return found


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _with_weights(tiny: Path, weights: bytes, extra: dict[str, bytes] | None = None) -> bytes:
    files = {path.name: path.read_bytes() for path in tiny.iterdir() if path.suffix != ".safetensors"}
    return _zip({**files, "model.safetensors": weights, **(extra or {})})


def _safetensors(header: bytes, data: bytes = b"\0" * 64, length: int | None = None, signed: bool = False) -> bytes:
    return struct.pack("<q" if signed else "<Q", len(header) if length is None else length) + header + data


def _load_upload(data: bytes):
    """What the Checkpoints page does: unpack, load; on refusal remove the workspace, as the page does."""
    folder, _, notes = prepare_zip(data, "evil.zip")
    try:
        return load_model_dir(folder), notes
    except CheckpointRefused:
        shutil.rmtree(folder.parent, ignore_errors=True)
        raise


HEADERS = {
    "a huge header length": _safetensors(b"{}", length=2**60),
    "a negative header length": _safetensors(b"{}", length=-5, signed=True),
    "invalid JSON in the header": _safetensors(b"{not json]"),
    "offsets outside the file": _safetensors(json.dumps({"w": {"dtype": "F32", "shape": [4],
                                                                "data_offsets": [0, 4000]}}).encode()),
    "overlapping offsets": _safetensors(json.dumps({
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
    }).encode()),
    "an unknown dtype": _safetensors(json.dumps({"w": {"dtype": "Q99", "shape": [4],
                                                        "data_offsets": [0, 16]}}).encode()),
    "a 0-byte weights file": b"",
}


@pytest.mark.parametrize("case", list(HEADERS))
def test_broken_safetensors_are_refused_and_the_bundled_model_still_works(tiny, no_leftovers, case):
    with pytest.raises(CheckpointRefused, match="not a readable safetensors file"):
        _load_upload(_with_weights(tiny, HEADERS[case]))
    bert = bundled_bert()
    assert replay_difference(capture(bert, "still here").records["self"]) < 1e-5


def test_weights_with_nan_or_inf_load_and_are_named(tiny, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "nan"
    shutil.copytree(tiny, folder)
    weights = load_file(folder / "model.safetensors")
    name = next(n for n in weights if n.endswith("c_attn.weight"))
    weights[name][0, 0] = float("nan")
    weights[next(n for n in weights if n.endswith("ln_f.weight"))][0] = float("inf")
    save_file(weights, folder / "model.safetensors")
    bundle = load_model_dir(folder)
    assert len(bundle.nonfinite) == 2 and any(name.endswith(n.split(".", 1)[-1]) for n in bundle.nonfinite)


@pytest.mark.parametrize("case", ["malformed", "enormous"])
def test_a_bad_tokenizer_falls_back_and_says_why(tiny, tmp_path, monkeypatch, case):
    folder = tmp_path / case
    shutil.copytree(tiny, folder)
    if case == "malformed":
        (folder / "tokenizer.json").write_text("{ this is not a tokenizer")
        (folder / "vocab.txt").unlink()
    else:
        monkeypatch.setitem(preflight.TOKENIZER_LIMITS, "tokenizer.json", 1000)  # as if it were gigabytes
    bundle = load_model_dir(folder)
    assert bundle.uses_fallback_tokenizer
    assert ("could not be read" if case == "malformed" else "larger than") in bundle.tokenizer_note


def test_nested_archives_are_not_opened(tiny, no_leftovers):
    inner = _zip({"payload.safetensors": b"whatever"})
    bundle, notes = _load_upload(_with_weights(tiny, (tiny / "model.safetensors").read_bytes(),
                                               {"inner.zip": inner}))
    assert "an archive inside the archive" in " ".join(notes)
    shutil.rmtree(bundle.folder.parent)


def test_names_with_control_characters_or_300_characters(tiny, no_leftovers):
    weights = (tiny / "model.safetensors").read_bytes()
    bundle, notes = _load_upload(_with_weights(tiny, weights, {"evil\x1b[2J.json": b"{}", "x" * 300 + ".json": b"{}"}))
    joined = " ".join(notes)
    assert "control characters" in joined and "longer than 255 bytes" in joined
    shutil.rmtree(bundle.folder.parent)
    with pytest.raises(CheckpointRefused, match="control characters"):
        prepare_single_files([("config.json", (tiny / "config.json").read_bytes()), ("vocab\x07.txt", b"a"),
                              ("model.safetensors", weights)])


def test_empty_files(tiny, no_leftovers):
    with pytest.raises(CheckpointRefused, match="empty"):
        prepare_zip(b"", "empty.zip")
    with pytest.raises(CheckpointRefused, match="not valid JSON"):
        _load_upload(_with_weights(tiny, (tiny / "model.safetensors").read_bytes(), {"config.json": b""}))


def test_a_model_root_confines_typed_paths_and_reveals_nothing(tiny, tmp_path, monkeypatch):
    root = tmp_path / "models"
    root.mkdir()
    inside = root / "gpt2"
    shutil.copytree(tiny, inside)
    (root / "escape").symlink_to(tiny.parent)  # a link out of the root
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOT", str(root))
    assert prepare_folder_path("gpt2")[0] == inside.resolve()  # relative to the root
    assert prepare_folder_path(str(inside))[0] == inside.resolve()
    messages = set()
    for outside in ("/etc", "/does/not/exist", str(tiny), "escape/tiny-gpt2", "../../..", str(root / "..")):
        with pytest.raises(CheckpointRefused) as refused:
            prepare_folder_path(outside)
        messages.add(str(refused.value))
    assert len(messages) == 1 and "give a path inside it" in messages.pop()  # the same words, whether it exists or not
    with pytest.raises(CheckpointRefused, match="does not exist"):
        prepare_folder_path("gpt3")  # inside the root, so saying so reveals nothing


def test_a_refused_upload_leaves_nothing_on_disk_and_the_page_says_so(tiny, tmp_path, monkeypatch):
    from tests.apptest_helpers import open_page

    uploads = tmp_path / "page-uploads"
    uploads.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(uploads))
    at = open_page("app_pages/checkpoints.py")
    at.file_uploader(key="ckpt_zip").set_value(("evil.zip", _with_weights(tiny, HEADERS["overlapping offsets"]),
                                                "application/zip")).run()
    at.button(key="ckpt_zip_load").click().run()
    assert not at.exception
    assert any("not a readable safetensors file" in e.value for e in at.error)
    assert leftovers(uploads) == []
    assert torch.is_tensor(bundled_bert().model.embeddings.word_embeddings.weight)
