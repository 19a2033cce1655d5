"""Kept models: one browser's uploads survive its reloads, for a bounded time and size, and no one else's."""

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from attnviz.app import SCRIPT
from attnviz.checkpoints import keep
from attnviz.checkpoints.uploads import prepare_zip
from tests.tiny_models import make_tiny_checkpoint, zip_folder


@pytest.fixture
def upload(tmp_path):
    """An upload as the Checkpoints page has it: extracted into its own temporary workspace."""
    archive = zip_folder(make_tiny_checkpoint("gpt2", tmp_path / "src" / "tiny-gpt2"), tmp_path / "tiny-gpt2.zip")

    def make():
        folder, owned, _notes = prepare_zip(archive.read_bytes(), "tiny-gpt2.zip")
        assert owned and folder.parent.name.startswith("attnviz-upload-")
        return folder
    return make


def keep_upload(store: keep.BrowserStore, name: str, folder: Path, dtype: str) -> Path | None:
    """What a session does with an upload: adopt it into the browser's folder before loading, record it once
    loaded (attnviz.ui's session models)."""
    moved = store.adopt_upload(folder)
    if moved is not None:
        assert store.record(name, "upload", moved, dtype)
    return moved


def test_keys_are_random_and_only_their_hash_is_on_disk(tmp_path, upload):
    key, other = keep.new_key(), keep.new_key()
    assert key != other and keep.valid_key(key) and len(key) == 43
    for bad in ("", "../../etc", "a" * 42, "a" * 44, "a/b" + "c" * 40, None, 42):
        assert not keep.valid_key(bad)
        with pytest.raises(ValueError):
            keep.BrowserStore(bad, tmp_path / "kept")
    store = keep.BrowserStore(key, tmp_path / "kept")
    keep_upload(store, "tiny-gpt2", upload(), "stored")
    assert [p.name for p in (tmp_path / "kept").iterdir()] == [hashlib.sha256(key.encode()).hexdigest()[:40]]
    assert key not in "".join(str(p) for p in (tmp_path / "kept").rglob("*"))
    assert key not in (store.folder / keep.MANIFEST).read_text()


def test_an_upload_moves_into_its_browser_and_comes_back(tmp_path, upload):
    key = keep.new_key()
    folder = upload()
    workspace = folder.parent
    moved = keep_upload(keep.BrowserStore(key, tmp_path / "kept"), "tiny-gpt2", folder, "fp32")
    assert moved is not None and (moved / "config.json").is_file() and not workspace.exists()
    (model, path), = keep.BrowserStore(key, tmp_path / "kept").models()  # a reload: a new store object, the same key
    assert (model.name, model.kind, model.dtype, path) == ("tiny-gpt2", "upload", "fp32", moved)
    assert keep.BrowserStore(keep.new_key(), tmp_path / "kept").models() == []  # another browser sees nothing


def test_a_server_folder_is_kept_by_path_and_never_deleted(tmp_path):
    served = make_tiny_checkpoint("bert", tmp_path / "served" / "local-bert")
    store = keep.BrowserStore(keep.new_key(), tmp_path / "kept")
    assert store.record("local-bert", "folder", served, "stored")
    ((model, path),) = store.models()
    assert model.kind == "folder" and path == served
    store.forget(served)
    assert store.models() == [] and (served / "config.json").is_file()


def test_forget_deletes_an_uploads_files(tmp_path, upload):
    store = keep.BrowserStore(keep.new_key(), tmp_path / "kept")
    moved = keep_upload(store, "tiny-gpt2", upload(), "stored")
    other = keep_upload(store, "another", upload(), "stored")
    store.forget(moved)
    assert [m.name for m, _ in store.models()] == ["another"] and not moved.exists() and not moved.parent.exists()
    assert other.exists()


def test_bounds_per_browser_and_in_total(tmp_path, upload, monkeypatch):
    store = keep.BrowserStore(keep.new_key(), tmp_path / "kept")
    for index in range(keep.MAX_KEPT_MODELS):
        assert keep_upload(store, f"m{index}", upload(), "stored") is not None
    extra = upload()
    assert keep_upload(store, "one too many", extra, "stored") is None and extra.exists()  # left to its session
    monkeypatch.setenv("ATTNVIZ_KEEP_GB", str(keep.root_bytes(tmp_path / "kept") / 1024**3))  # full to the byte
    other = upload()
    assert keep_upload(keep.BrowserStore(keep.new_key(), tmp_path / "kept"), "no room", other, "stored") is None
    assert other.exists()


def test_files_whose_folder_went_are_dropped_from_the_list(tmp_path, upload):
    store = keep.BrowserStore(keep.new_key(), tmp_path / "kept")
    moved = keep_upload(store, "tiny-gpt2", upload(), "stored")
    (moved / "config.json").unlink()
    assert store.models() == []
    assert store._read() == []


def test_expired_browsers_are_deleted_and_recent_ones_stay(tmp_path, upload):
    root = keep.usable_root(tmp_path / "kept")
    old, recent = (keep.BrowserStore(keep.new_key(), root) for _ in range(2))
    old_files = keep_upload(old, "tiny-gpt2", upload(), "stored")
    keep_upload(recent, "tiny-gpt2", upload(), "stored")
    day_ago = time.time() - 25 * 3600
    os.utime(old.folder, (day_ago, day_ago))
    unrelated = root / "not-a-browser-folder"
    unrelated.mkdir()
    os.utime(unrelated, (day_ago, day_ago))
    assert keep.sweep_expired(tmp_path / "kept", hours=24) == [old.folder]
    assert unrelated.exists()  # only folders this module made are ever swept
    assert not old.folder.exists() and not old_files.exists() and recent.folder.exists()
    recent.models()  # a visit renews the browser's time
    assert time.time() - recent.folder.stat().st_mtime < 60


def test_settings_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("ATTNVIZ_KEEP_HOURS", "0")
    assert keep.keep_hours() == 0
    monkeypatch.setenv("ATTNVIZ_KEEP_HOURS", "not a number")
    assert keep.keep_hours() == 24
    monkeypatch.setenv("ATTNVIZ_KEEP_DIR", "/srv/attnviz-kept")
    assert str(keep.keep_root()) == "/srv/attnviz-kept"


# In the app (AppTest): the browser key is what its cookie would hold; a new AppTest is a reload.

CHECKPOINTS = "app_pages/checkpoints.py"


def _upload_in(at, archive):
    at.file_uploader(key="ckpt_zip").set_value(("tiny-gpt2.zip", archive.read_bytes(), "application/zip")).run()
    at.button(key="ckpt_zip_load").click().run()
    assert not at.exception, [e.value for e in at.exception]


def test_a_reload_brings_the_browsers_models_back_and_no_one_elses(tmp_path):
    from tests.apptest_helpers import open_page

    archive = zip_folder(make_tiny_checkpoint("gpt2", tmp_path / "src" / "tiny-gpt2"), tmp_path / "tiny-gpt2.zip")
    key = keep.new_key()
    first = open_page(CHECKPOINTS, browser_key=key, ckpt_dtype="fp32")
    _upload_in(first, archive)
    kept_folder = first.session_state["models"]["tiny-gpt2"]
    assert keep.BrowserStore(key).holds(kept_folder)  # moved out of the session's temporary folder

    reloaded = open_page(CHECKPOINTS, browser_key=key)  # the same browser, a new session
    assert reloaded.session_state["models"]["tiny-gpt2"] == kept_folder
    assert reloaded.session_state["model_dtypes"]["tiny-gpt2"] == "fp32"  # its settings too
    again = _open_link({}, key)  # its first run says so
    assert any("tiny-gpt2" in t.value for t in again.toast), [t.value for t in again.toast]

    stranger = open_page(CHECKPOINTS, browser_key=keep.new_key())
    assert "tiny-gpt2" not in stranger.session_state["models"]

    reloaded.button(key="ckpt_remove_tiny-gpt2").click().run()  # removed: gone for good
    assert not Path(kept_folder).exists()
    assert "tiny-gpt2" not in open_page(CHECKPOINTS, browser_key=key).session_state["models"]


def test_with_keeping_off_an_upload_stays_with_its_session(tmp_path, monkeypatch):
    from tests.apptest_helpers import open_page

    monkeypatch.setenv("ATTNVIZ_KEEP_HOURS", "0")
    archive = zip_folder(make_tiny_checkpoint("gpt2", tmp_path / "src" / "tiny-gpt2"), tmp_path / "tiny-gpt2.zip")
    at = open_page(CHECKPOINTS)
    _upload_in(at, archive)
    folder = Path(at.session_state["models"]["tiny-gpt2"])
    assert folder.parent.name.startswith("attnviz-upload-") and str(folder) in at.session_state["uploads"].folders


def _open_link(query: dict, key: str | None = None):
    from streamlit.testing.v1 import AppTest


    at = AppTest.from_file(str(SCRIPT), default_timeout=120)
    for name, value in query.items():
        at.query_params[name] = value
    at.session_state["browser_key"] = key or keep.new_key()
    return at.run()


def test_a_link_to_a_model_this_browser_lacks_falls_back_with_a_notice():
    at = _open_link({"model": "someone-elses-upload"})
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["model"] == "all-MiniLM-L6-v2 (bundled BERT)"
    assert any("someone-elses-upload" in w.value and "bundled model instead" in w.value for w in at.warning)


def test_a_link_to_a_server_folder_opens_it_for_anyone(tmp_path, monkeypatch):
    root = tmp_path / "models"
    make_tiny_checkpoint("bert", root / "local-bert")
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOT", str(root))
    at = _open_link({"model": "local-bert"})
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["models"]["local-bert"] == str((root / "local-bert").resolve())
    assert at.session_state["model"] == "local-bert" and not at.warning
    outside = make_tiny_checkpoint("bert", tmp_path / "elsewhere" / "outside-bert")
    refused = _open_link({"model": str(outside)})  # outside the model root: not opened, the same notice
    assert str(outside) not in refused.session_state["models"] and refused.warning
    monkeypatch.setenv("ATTNVIZ_SERVER_FOLDERS", "0")
    assert _open_link({"model": "local-bert"}).warning  # folders switched off: not even inside the root


def test_a_keep_dir_set_by_mistake_loses_nothing(tmp_path):
    models = tmp_path / "models"
    make_tiny_checkpoint("bert", models / "old-bert")
    day_ago = time.time() - 48 * 3600
    os.utime(models / "old-bert", (day_ago, day_ago))
    assert keep.sweep_expired(models, hours=0) == [] and (models / "old-bert" / "config.json").is_file()


def test_a_keep_root_others_could_write_is_not_used(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    assert keep.usable_root(shared) is None
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "private")
    (tmp_path / "private").mkdir(mode=0o700)
    assert keep.usable_root(link) is None
    assert keep.usable_root(tmp_path / "fresh") == tmp_path / "fresh"
    assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o700


def test_a_crafted_manifest_cannot_point_outside_its_browser(tmp_path):
    victim = make_tiny_checkpoint("bert", tmp_path / "victim")
    store = keep.BrowserStore(keep.new_key(), tmp_path / "kept")
    store.folder.mkdir(parents=True)
    entries = [{"name": "a", "kind": "upload", "folder": str(victim), "dtype": "stored", "added": 0},
               {"name": "b", "kind": "upload", "folder": "uploads/../../../victim", "dtype": "stored", "added": 0}]
    (store.folder / keep.MANIFEST).write_text(json.dumps(entries))
    assert store.models() == []
    store.forget(victim)
    assert (victim / "config.json").is_file()


def test_two_tabs_recording_at_once_lose_nothing(tmp_path):
    import threading

    store_path = tmp_path / "kept"
    key = keep.new_key()
    folders = [make_tiny_checkpoint("bert", tmp_path / f"served-{i}") for i in range(3)]
    threads = [threading.Thread(target=keep.BrowserStore(key, store_path).record,
                                args=(f"m{i}", "folder", f, "stored"))
               for i, f in enumerate(folders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert keep.BrowserStore(key, store_path).names() == {"m0", "m1", "m2"}
    assert not keep.BrowserStore(key, store_path).record("m0", "folder", folders[0], "stored")  # names stay unique


def test_kept_uploads_cannot_be_opened_by_their_path(tmp_path, upload, monkeypatch):
    from attnviz.checkpoints.safety import CheckpointRefused
    from attnviz.checkpoints.uploads import prepare_folder_path

    monkeypatch.setenv("ATTNVIZ_KEEP_DIR", str(tmp_path / "kept"))
    moved = keep_upload(keep.BrowserStore(keep.new_key()), "tiny-gpt2", upload(), "stored")
    with pytest.raises(CheckpointRefused, match="not by their path"):
        prepare_folder_path(str(moved))
    with pytest.raises(CheckpointRefused, match="not by their path"):
        prepare_folder_path(str(upload()))  # nor a session's upload in its temporary workspace
