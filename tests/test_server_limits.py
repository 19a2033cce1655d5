"""A shared server's other bounds: links whose numbers no widget can take, a shared-layer model's cost counted by
its layer calls, each uploader's own size limit, and disk that corpora, scans and exports reserve (per browser and
for everyone) before they write, with refusals that say the numbers."""

import ast
import json
import tempfile
import time
from pathlib import Path

import pytest

from attnviz.app import SCRIPT
from attnviz.checkpoints import disk
from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.ui.links import unusable

ROOT = Path(__file__).resolve().parent.parent


# -- links ---------------------------------------------------------------------------------------------------------


def test_numbers_no_widget_can_take_are_named():
    assert all(unusable("head", value) for value in ("inf", "-inf", "1e309", "nan", " Infinity", "1e16"))
    assert not any(unusable("head", value) for value in ("3", "-2", "2.5", "Causal (GPT)", "", "1e3"))
    assert not unusable("sentence", "inf") and not unusable("model", "1e309")  # free text is kept as typed


@pytest.mark.parametrize("params, kept", [({"head": "inf"}, {}), ({"layer": "1e309"}, {}),
                                          ({"layer": "2", "head": "-inf"}, {"layer": "2"}),
                                          ({"sentence": "inf"}, {"sentence": "inf"})])
def test_a_link_with_an_infinite_number_opens_the_page_and_leaves_the_url(params, kept, clean_streamlit_caches):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(SCRIPT), default_timeout=120)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception and not at.error, ([e.value for e in at.exception], [e.value for e in at.error])
    assert dict(at.query_params) == kept  # a reload does not fail again
    assert at.session_state["layer"] == int(kept.get("layer", 0))
    if "sentence" in kept:
        assert at.session_state["sentence"] == "inf"


# -- a shared layer's cost -----------------------------------------------------------------------------------------


def test_a_shared_layer_declared_many_times_is_bounded_by_its_layer_calls(tmp_path):
    """ALBERT's one layer serves every layer: the same weights declared as 256 layers would cost 128 times the 2
    they were made with at every capture. Refused in words; the real shapes of ALBERT still load."""
    from transformers import AlbertConfig

    from attnviz.bench.tiny import make_tiny_checkpoint, tiny_config
    from attnviz.models.loading import MAX_REUSE, layer_call_cost, load_model_dir

    config = tiny_config("albert")  # a layer that outweighs the tiny vocabulary's embeddings, as in real models
    config.update({"hidden_size": 128, "intermediate_size": 512})
    folder = make_tiny_checkpoint("albert", tmp_path / "albert", config=config)
    assert load_model_dir(folder).n_layers == 2
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 256
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointRefused, match=f"runs its shared layers 256 times: .* up to {MAX_REUSE} times its "
                                                "weights"):
        load_model_dir(folder)
    import torch
    from transformers import AutoModel

    for shape in (dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072, num_hidden_layers=12),
                  dict(hidden_size=2048, num_attention_heads=16, intermediate_size=8192, num_hidden_layers=24),
                  dict(hidden_size=4096, num_attention_heads=64, intermediate_size=16384, num_hidden_layers=12)):
        real = AlbertConfig(embedding_size=128, **shape)  # base, xlarge, xxlarge
        with torch.device("meta"):
            skeleton = AutoModel.from_config(real)
        weights = sum(p.numel() for p in skeleton.parameters())
        assert weights < layer_call_cost(skeleton, real) <= MAX_REUSE * weights
    # layers that are not a multiple of the groups: each call still runs one group (a groups'th of them)
    uneven = AlbertConfig(embedding_size=16, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                          vocab_size=100, num_hidden_layers=255, num_hidden_groups=128)
    with torch.device("meta"):
        skeleton = AutoModel.from_config(uneven)
    shared = sum(p.numel() for name, p in skeleton.named_parameters() if "layer_groups" in name)
    weights = sum(p.numel() for p in skeleton.parameters())
    assert layer_call_cost(skeleton, uneven) == weights - shared + -(-255 * shared // 128)


# -- uploaders -----------------------------------------------------------------------------------------------------


def test_every_uploader_refuses_past_its_own_limit_before_the_upload():
    """Each uploader states its limit to the browser (``max_upload_size``), so an honest client never sends more;
    only the checkpoint uploaders take the server's whole ``server.maxUploadSize`` (their real need)."""
    found = {}
    widget_files = [*(ROOT / "attnviz" / "app").rglob("*.py"), *(ROOT / "attnviz" / "ui").rglob("*.py")]
    for path in sorted(widget_files):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "file_uploader":
                keywords = {k.arg: k.value for k in node.keywords}
                key = keywords["key"].value
                found[key] = "max_upload_size" in keywords
    assert found == {"ckpt_zip": False, "ckpt_files": False, "corpus_upload": True, "explore_long_file": True,
                     "explore_image_file": True, "flash_upload": True,
                     "pat_corpus_upload": True}


# -- disk ----------------------------------------------------------------------------------------------------------


@pytest.fixture
def own_disk(tmp_path, monkeypatch):
    """An uploads root and a keep root of this test's own, so that the limits below count only its files."""
    folder = tmp_path / "temporary"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("ATTNVIZ_KEEP_DIR", str(tmp_path / "kept"))
    return tmp_path


def test_kept_corpora_reserve_their_bytes_within_what_one_browser_may_keep(own_disk, monkeypatch):
    """The reported case: 15 MB for every upload together. One browser's corpora stop at its share (a quarter),
    refused with the numbers, and another browser's 4.6 MB checkpoint still fits."""
    from attnviz.checkpoints.keep import keep_root
    from attnviz.corpus.background import ScanFolder, browser_limit_bytes

    monkeypatch.setenv("ATTNVIZ_UPLOADS_GB", str(15 / 1024))
    assert browser_limit_bytes() == 15 * 1024**2 // 4
    one = ScanFolder(keep_root() / ("a" * 40) / "scans")
    corpus = b"word " * (2 * 1024**2 // 5)
    one.keep_corpus(corpus, "first.txt")
    with pytest.raises(CheckpointRefused, match=r"this browser's corpora, scans and runs take 2\.0 MB of the 3\.8 MB "
                                                r"one browser may keep on this server, and this corpus needs up to "
                                                r"2\.0 MB more"):
        one.keep_corpus(corpus + b"!", "second.txt")
    assert len(one.corpora()) == 1 and not [p for p in one.folder.iterdir() if p.name.startswith(".")]
    with disk.reserve(disk.new_workspace(), int(4.6 * 1024**2), [keep_root()]):
        pass  # another browser's checkpoint upload


def test_a_corpus_past_the_servers_space_is_refused_and_old_corpora_make_room(own_disk, monkeypatch):
    from attnviz.checkpoints.keep import keep_root
    from attnviz.corpus.background import MAX_CORPORA, ScanFolder

    monkeypatch.setenv("ATTNVIZ_BROWSER_GB", "1")
    folder = ScanFolder(keep_root() / ("b" * 40) / "scans")
    kept = [folder.keep_corpus(f"document {i}\n".encode() * 1000, f"c{i}.txt") for i in range(MAX_CORPORA + 2)]
    assert len(folder.corpora()) == MAX_CORPORA and kept[-1] in folder.corpora()  # the oldest went
    in_use = str(folder.corpora()[-1])
    folder.keep_corpus(b"another\n" * 1000, "d.txt", in_use={in_use})
    assert in_use in map(str, folder.corpora())  # never the one a job reads
    monkeypatch.setenv("ATTNVIZ_UPLOADS_GB", str(disk.in_use([keep_root()]) / 1024**3))
    with pytest.raises(CheckpointRefused, match="this server's space for uploads is full .* this corpus needs up to"):
        folder.keep_corpus(b"one more\n" * 50_000, "e.txt")  # 450 KB: more than the oldest corpus frees


def test_a_scan_reserves_its_estimate_before_it_is_queued_and_releases_it_when_it_ends(own_disk, monkeypatch):
    from attnviz.checkpoints.keep import keep_root
    from attnviz.corpus.background import ScanFolder
    from attnviz.corpus.jobs import JobQueue
    from attnviz.corpus.scan.runner import ScanSettings

    monkeypatch.setenv("ATTNVIZ_BROWSER_GB", str(50 / 1024))
    queue = JobQueue(own_disk / "queue")
    folder = ScanFolder(keep_root() / ("c" * 40) / "scans", queue=queue)
    settings = ScanSettings(max_docs=2, max_tokens=8, qk_points=0)
    with pytest.raises(CheckpointRefused, match="one browser may keep on this server, and this scan needs up to "
                                                "60.0 MB more"):
        folder.start("k1", "bundled", "/nowhere", settings, disk_bytes=60 * 1024**2)
    assert folder.job() is None and disk._pending(disk.uploads_root()) == 0  # nothing queued, nothing reserved
    job = folder.start("k2", "bundled", "/nowhere", settings, disk_bytes=20 * 1024**2)
    assert job is not None and disk._pending(disk.uploads_root(), str(folder.owner)) <= 20 * 1024**2
    deadline = time.monotonic() + 60
    while folder.job() is not None:  # the command fails at once (no model there): the job ends
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert disk._pending(disk.uploads_root()) == 0
    assert folder.progress("k2")["status"] == "failed" and "/nowhere" in folder.progress("k2")["error"]
