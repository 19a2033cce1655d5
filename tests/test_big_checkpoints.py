"""Big checkpoints: sharded safetensors (zip and multi-file upload), the stored dtype, disk offload through
accelerate when the weights outgrow the memory budget, and one configured upload limit."""

import pytest
import torch

from attnviz.checkpoints import safety
from attnviz.checkpoints.uploads import prepare_single_files, prepare_zip
from attnviz.models.capture import capture
from attnviz.models.loading import load_model_dir, placement
from attnviz.models.replay_check import replay_difference
from tests.test_models import eager_attentions
from tests.tiny_models import TOKENIZER_FILES, make_tiny_checkpoint, zip_folder

TEXT = "big checkpoints come in shards"


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A tiny Llama saved in several shards with its index, plus the tokenizer files."""
    from transformers import AutoModel

    root = tmp_path_factory.mktemp("sharded")
    whole = make_tiny_checkpoint("llama", root / "whole")
    folder = root / "sharded"
    AutoModel.from_pretrained(whole).save_pretrained(folder, max_shard_size="400KB")
    for name in TOKENIZER_FILES:
        if (whole / name).exists():
            (folder / name).write_bytes((whole / name).read_bytes())
    assert len(list(folder.glob("*.safetensors"))) >= 2 and (folder / "model.safetensors.index.json").exists()
    return whole, folder


def test_a_sharded_checkpoint_loads_from_a_zip_and_equals_the_whole_one(sharded, tmp_path):
    whole, folder = sharded
    extracted, owned, _ = prepare_zip(zip_folder(folder, tmp_path / "sharded.zip").read_bytes(), "sharded.zip")
    ours = capture(load_model_dir(extracted), TEXT).records["self"]
    reference = capture(load_model_dir(whole), TEXT).records["self"]
    torch.testing.assert_close(ours.weights, reference.weights, atol=0, rtol=0)


def test_a_sharded_checkpoint_loads_from_the_multi_file_upload(sharded):
    _, folder = sharded
    files = [(path.name, path.read_bytes()) for path in sorted(folder.iterdir())]
    uploaded, _, notes = prepare_single_files(files)
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    assert sorted(p.name for p in uploaded.glob("*.safetensors")) == shards
    bundle = load_model_dir(uploaded)
    assert replay_difference(capture(bundle, TEXT).records["self"]) < 1e-5


def test_weights_load_in_their_stored_dtype_unless_fp32_is_asked(tmp_path):
    from transformers import AutoModel

    folder = make_tiny_checkpoint("llama", tmp_path / "fp32")
    half = tmp_path / "bf16"
    AutoModel.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(half)
    for name in TOKENIZER_FILES:
        if (folder / name).exists():
            (half / name).write_bytes((folder / name).read_bytes())
    stored = load_model_dir(half)
    assert stored.dtype == "bfloat16" and "bfloat16" in stored.describe()
    record = capture(stored, TEXT).records["self"]
    assert record.queries.dtype == torch.bfloat16  # kept in the model's dtype...
    assert record.weights.dtype == torch.float32  # ...replayed in fp32
    torch.testing.assert_close(record.weights, eager_attentions(half, stored, TEXT)["self"].float(), atol=2e-2, rtol=0)
    assert load_model_dir(half, dtype="fp32").dtype == "float32"


def test_a_checkpoint_larger_than_the_memory_budget_is_offloaded_to_disk(sharded, tmp_path):
    whole, folder = sharded
    offloaded = load_model_dir(folder, max_memory={"cpu": "300KB"}, offload_folder=str(tmp_path / "offload"))
    assert "disk offload" in offloaded.placement and "disk offload" in offloaded.describe()
    record = capture(offloaded, TEXT).records["self"]
    reference = capture(load_model_dir(whole), TEXT).records["self"]
    torch.testing.assert_close(record.weights, reference.weights, atol=1e-6, rtol=0)
    assert replay_difference(record) < 1e-5


def test_placement_uses_the_gpu_first_when_there_is_one(sharded, monkeypatch):
    _, folder = sharded
    assert placement(folder) == {}  # small, CPU only: plain loading
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    where = placement(folder)
    assert where["device_map"] == "auto" and where["max_memory"] is None  # accelerate: GPU, then CPU, then disk


def test_the_upload_limit_is_set_once_and_is_at_least_2_gib():
    import tomllib

    with open(safety.STREAMLIT_CONFIG, "rb") as config:
        configured = tomllib.load(config)["server"]["maxUploadSize"]
    assert safety.MAX_UPLOAD_BYTES == configured * 1024**2 >= 2 * 1024**3
