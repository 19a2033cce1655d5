"""Every refusal path of the uploader, with crafted files; and the happy paths."""

import io
import json
import pickle
import stat
import zipfile
from pathlib import Path

import pytest

from attnviz.checkpoints import safety
from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.checkpoints.uploads import extract_zip, prepare_folder_path, prepare_single_files, prepare_zip
from attnviz.models.loading import load_model_dir
from tests.tiny_models import make_tiny_checkpoint, zip_folder


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    return make_tiny_checkpoint("gpt2", tmp_path_factory.mktemp("up") / "tiny-gpt2")


def zip_bytes(entries: dict[str, bytes], *, symlink: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/passwd")
    return buffer.getvalue()


def test_a_zipped_checkpoint_loads(tiny_gpt2, tmp_path):
    data = zip_folder(tiny_gpt2, tmp_path / "tiny-gpt2.zip", prefix="tiny-gpt2/").read_bytes()
    folder, owned, notes = prepare_zip(data, "tiny-gpt2.zip")
    assert owned and folder.name == "tiny-gpt2" and (folder / "config.json").is_file()
    bundle = load_model_dir(folder)
    assert bundle.model_type == "gpt2" and not bundle.uses_fallback_tokenizer


def test_path_traversal_is_refused(tmp_path):
    data = zip_bytes({"config.json": b"{}", "../../evil.txt": b"owned"})
    with pytest.raises(CheckpointRefused, match="climbs out"):
        extract_zip(io.BytesIO(data), tmp_path / "out")
    assert not (tmp_path / "evil.txt").exists()
    with pytest.raises(CheckpointRefused, match="absolute path"):
        extract_zip(io.BytesIO(zip_bytes({"/tmp/evil.txt": b"x"})), tmp_path / "out2")


def test_symlink_member_is_refused(tmp_path):
    with pytest.raises(CheckpointRefused, match="symbolic link"):
        extract_zip(io.BytesIO(zip_bytes({"config.json": b"{}"}, symlink="vocab.txt")), tmp_path / "out")


def test_zip_bomb_is_stopped_by_bytes_written(tmp_path):
    bomb = zip_bytes({"config.json": b"{}", "model.safetensors": b"\0" * (3 * 1024 * 1024)})  # a few KB zipped
    assert len(bomb) < 50_000
    with pytest.raises(CheckpointRefused, match="zip bomb"):
        extract_zip(io.BytesIO(bomb), tmp_path / "out", max_bytes=1024 * 1024)
    assert not (tmp_path / "out" / "model.safetensors").exists()  # refused on the entries' sizes, before writing


def test_too_many_members_is_refused(tmp_path):
    data = zip_bytes({f"f{i}.txt": b"x" for i in range(30)})
    with pytest.raises(CheckpointRefused, match="entries"):
        extract_zip(io.BytesIO(data), tmp_path / "out", max_members=20)


def test_pickle_and_code_are_never_extracted(tmp_path):
    evil = pickle.dumps({"weights": 1})
    data = zip_bytes({"config.json": b"{}", "pytorch_model.bin": evil, "modeling_evil.py": b"import os",
                      "x.exe": b"MZ", "README.md": b"# not needed"})
    report = extract_zip(io.BytesIO(data), tmp_path / "out")
    assert report.files == ["config.json"] and [p.name for p in (tmp_path / "out").iterdir()] == ["config.json"]
    assert len(report.skipped) == 4 and any("pickle" in s for s in report.skipped)
    assert any("README.md (not a file the model needs)" in s for s in report.skipped)
    assert not (tmp_path / "out" / "pytorch_model.bin").exists()


def test_pickle_only_checkpoint_is_refused_with_the_reason(tiny_gpt2, tmp_path):
    config = (tiny_gpt2 / "config.json").read_bytes()
    data = zip_bytes({"config.json": config, "pytorch_model.bin": pickle.dumps({"a": 1})})
    folder, _, notes = prepare_zip(data, "pickled.zip")
    assert any("pickle" in note for note in notes)
    with pytest.raises(CheckpointRefused, match="safetensors"):
        load_model_dir(folder)
    (tmp_path / "direct").mkdir()
    (tmp_path / "direct" / "config.json").write_bytes(config)
    (tmp_path / "direct" / "pytorch_model.bin").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(CheckpointRefused, match="pickle format"):
        load_model_dir(tmp_path / "direct")


def test_missing_config_is_refused():
    with pytest.raises(CheckpointRefused, match="config.json"):
        prepare_zip(zip_bytes({"model.safetensors": b"x"}), "noconfig.zip")


def test_auto_map_is_refused(tiny_gpt2, tmp_path):
    config = json.loads((tiny_gpt2 / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((tiny_gpt2 / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointRefused, match="auto_map"):
        load_model_dir(folder)


def test_unknown_architecture_and_broken_config(tmp_path):
    folder = tmp_path / "unknown"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "definitely-not-a-model"}))
    with pytest.raises(CheckpointRefused, match="does not know"):
        load_model_dir(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointRefused, match="not valid JSON"):
        load_model_dir(folder)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointRefused, match="JSON object"):
        load_model_dir(folder)


def test_garbage_bytes(tmp_path, tiny_gpt2):
    with pytest.raises(CheckpointRefused, match="not a readable zip"):
        prepare_zip(b"\x89PNG garbage" * 100, "garbage.zip")
    folder = tmp_path / "garbage-weights"
    folder.mkdir()
    (folder / "config.json").write_bytes((tiny_gpt2 / "config.json").read_bytes())
    (folder / "model.safetensors").write_bytes(b"\x00\x01garbage" * 1000)
    with pytest.raises(CheckpointRefused, match="not a readable safetensors file"):
        load_model_dir(folder)


def test_oversize_upload_is_refused(monkeypatch):
    monkeypatch.setattr("attnviz.checkpoints.uploads.MAX_UPLOAD_BYTES", 1000)
    with pytest.raises(CheckpointRefused, match="limit"):
        prepare_zip(b"x" * 2000, "big.zip")
    with pytest.raises(CheckpointRefused, match="empty"):
        prepare_zip(b"", "empty.zip")


def test_single_safetensors_with_config(tiny_gpt2):
    files = [
        ("weights.safetensors", (tiny_gpt2 / "model.safetensors").read_bytes()),
        ("config.json", (tiny_gpt2 / "config.json").read_bytes()),
        ("../../vocab.txt", (tiny_gpt2 / "vocab.txt").read_bytes()),  # a browser-supplied name is reduced to its base
        ("evil.pkl", pickle.dumps(1)),
    ]
    folder, owned, notes = prepare_single_files(files)
    assert owned and (folder / "model.safetensors").is_file() and (folder / "vocab.txt").is_file()
    assert any("evil.pkl" in n for n in notes)
    assert load_model_dir(folder).model_type == "gpt2"
    with pytest.raises(CheckpointRefused, match="config.json is missing"):
        prepare_single_files([("weights.safetensors", b"x")])


def test_folder_path(tiny_gpt2, tmp_path):
    folder, owned, _ = prepare_folder_path(f"  '{tiny_gpt2}'  ")
    assert folder == tiny_gpt2.resolve() and not owned
    with pytest.raises(CheckpointRefused, match="does not exist"):
        prepare_folder_path(str(tmp_path / "nope"))
    with pytest.raises(CheckpointRefused, match="is a file"):
        prepare_folder_path(str(tiny_gpt2 / "config.json"))
    with pytest.raises(CheckpointRefused, match="type the path"):
        prepare_folder_path("   ")


def test_limits_match_the_server_config():
    """The app's settings sit beside its script (what `attnviz serve` reads); a checkout's .streamlit/config.toml,
    read by `streamlit run app.py`, is the same file's copy."""
    root = Path(__file__).resolve().parents[1]
    config = root / "attnviz" / "app" / ".streamlit" / "config.toml"
    assert safety.STREAMLIT_CONFIG == config
    assert f"maxUploadSize = {safety.MAX_UPLOAD_BYTES // 1024**2}" in config.read_text()
    assert (root / ".streamlit" / "config.toml").read_text() == config.read_text()


def test_config_far_larger_than_its_weights_is_refused_before_allocating(tiny_gpt2, tmp_path):
    config = json.loads((tiny_gpt2 / "config.json").read_text())
    config.update(n_embd=4096, n_layer=48, n_head=32)  # ~10B parameters described, 1M present
    folder = tmp_path / "oversize"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((tiny_gpt2 / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointRefused, match="B parameters|hold only"):
        load_model_dir(folder)
    config.update(n_embd=256, n_layer=4, n_head=4)  # small enough to build, but still not these weights
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointRefused, match="hold only"):
        load_model_dir(folder)


def test_parameters_are_counted_from_headers(tiny_gpt2):
    from safetensors.torch import load_file

    from attnviz.models.loading import parameters_in_files

    expected = sum(t.numel() for t in load_file(str(tiny_gpt2 / "model.safetensors")).values())
    assert parameters_in_files(tiny_gpt2) == expected


def test_a_folder_given_by_a_relative_path_loads(tiny_gpt2, monkeypatch):
    """As `python -m attnviz.corpus.scan corpus.txt --model ./my-model` passes it: the checked files' links in the view
    transformers reads must not depend on the working folder (they once pointed nowhere, and the load failed with
    "Should have a `model_type` key")."""
    from attnviz.models.with_heads import load_causal_lm

    folder = Path(tiny_gpt2)
    monkeypatch.chdir(folder.parent)
    relative = Path(".") / folder.name
    bundle = load_model_dir(relative)
    assert bundle.n_layers == load_model_dir(folder).n_layers
    model, tokenizer = load_causal_lm(relative)
    assert model.config.model_type == "gpt2" and tokenizer is not None


def test_a_sub_config_may_leave_its_model_type_empty_but_the_model_may_not():
    """transformers writes ``"model_type": ""`` in sub-configs that are not models (MPT's ``attn_config``): such
    checkpoints load (MPT is on the tested list); an empty or missing type at the top is refused in words."""
    from attnviz.checkpoints.config_numbers import check_config_numbers

    check_config_numbers({"model_type": "mpt", "attn_config": {"model_type": "", "alibi": True}}, 10, 1_000)
    with pytest.raises(CheckpointRefused, match="model_type is empty"):
        check_config_numbers({"model_type": ""}, 10, 1_000)
    with pytest.raises(CheckpointRefused, match="not int"):
        check_config_numbers({"model_type": "mpt", "attn_config": {"model_type": 3}}, 10, 1_000)
