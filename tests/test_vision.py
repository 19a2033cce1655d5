"""Vision transformers: tiny random ViT, DeiT, DINOv2, CLIP and SigLIP vision models made here, their attention
against transformers' eager weights, patch layouts, overlays, image validation, and the Explore page."""

import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from attnviz.bench.tiny import VISION_KINDS
from attnviz.core import vision
from attnviz.models.capture import capture_image
from attnviz.models.loading import folder_reads_images, load_model_dir
from attnviz.models.replay_check import replay_difference
from attnviz.models.shipped import default_model_dir
from tests.apptest_helpers import figures, open_page

PREFIX = {"vit": ["[CLS]"], "deit": ["[CLS]", "[DIST]"], "dinov2": ["[CLS]"], "clip_vision_model": ["[CLS]"],
          "siglip_vision_model": []}


@pytest.fixture(scope="module")
def vision_checkpoint(tiny_checkpoint):
    return lambda kind, **options: tiny_checkpoint(kind, vision=True, **options)


@pytest.fixture(scope="module")
def photo():
    return vision.sample_image("China (scikit-learn sample)")


def png(width: int, height: int, colour=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("kind", VISION_KINDS)
def test_every_vision_type_matches_transformers_eager_weights(vision_checkpoint, photo, kind):
    from transformers import AutoModel

    folder = vision_checkpoint(kind)
    bundle = load_model_dir(folder)
    assert bundle.modality == "image" and bundle.architecture == "encoder" and bundle.tokenizer_note is None
    result = capture_image(bundle, photo, "china.jpg")
    record = result.records["self"]
    assert bundle.max_positions == len(result.tokens)  # what the caption says it reads
    assert result.tokens[: len(PREFIX[kind])] == PREFIX[kind]
    assert result.tokens[len(PREFIX[kind])] == "(0,0)" and result.tokens[-1] == "(3,3)"  # 32 px in 8 px patches
    assert result.image.shape == (32, 32, 3) and result.image.dtype == np.uint8
    reference = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = reference(pixel_values=vision.pixel_values(bundle.image_processor, photo),
                             output_attentions=True).attentions
    torch.testing.assert_close(record.weights, torch.cat(expected), atol=1e-5, rtol=0)
    assert replay_difference(record) < 1e-5


def test_a_vision_record_names_the_prefix_tokens(vision_checkpoint, photo, monkeypatch):
    from dataclasses import replace

    from attnviz.models import architectures

    deit = architectures.ARCHITECTURES["deit"]
    monkeypatch.setitem(architectures.ARCHITECTURES, "deit", replace(deit, image_prefix=("[FIRST]", "[SECOND]")))
    bundle = load_model_dir(vision_checkpoint("deit"))
    assert capture_image(bundle, photo).tokens[:3] == ["[FIRST]", "[SECOND]", "(0,0)"]


def test_overlays_put_each_patch_where_it_is(vision_checkpoint, photo):
    result = capture_image(load_model_dir(vision_checkpoint("deit")), photo)
    layout = result.layout
    assert (layout.rows, layout.cols, layout.patch) == (4, 4, 8)
    record = result.records["self"]
    shown = vision.overlay(result, 1, "head", 2, 0)
    row = record.head_weights(1, 2, 0, 1)[0]
    assert shown.grid.shape == (4, 4)
    assert shown.grid[1, 3] == pytest.approx(float(row[layout.token_of(1, 3)]))  # patch (1,3) = token 2 + 7
    assert layout.token_of(1, 3) == 9 and layout.patch_of(9) == (1, 3) and layout.patch_of(1) is None
    assert shown.grid.sum() + shown.prefix_share == pytest.approx(1.0, abs=1e-5)
    assert "[CLS], [DIST]" in shown.title
    mean = vision.overlay(result, 0, "mean", 0, 5)
    expected = record.layer_weights(0, 5, 6).mean(0)[0]
    assert mean.grid.sum() + mean.prefix_share == pytest.approx(float(expected.sum()), abs=1e-5)
    rolled = vision.overlay(result, 1, "rollout", 0, 0)
    assert rolled.grid.sum() + rolled.prefix_share == pytest.approx(1.0, abs=1e-5)  # rollout rows sum to 1
    assert vision.token_at_pixel(layout, 27.0, 9.5) == layout.token_of(1, 3)
    assert vision.token_at_pixel(layout, 40.0, 3.0) is None


def test_the_overlay_figure_sends_one_png_and_a_clickable_patch_grid(vision_checkpoint, photo):
    from attnviz.viz.vision import overlay_figure

    result = capture_image(load_model_dir(vision_checkpoint("vit")), photo)
    shown = vision.overlay(result, 0, "head", 0, 6)
    figure = overlay_figure(result.image, shown.grid, result.layout, 6, shown.title)
    image, heatmap, points = figure.data
    assert image.source.startswith("data:image/png;base64,")
    np.testing.assert_array_equal(heatmap.z, shown.grid)
    # the clickable centres: patch (1,2) is the 7th point, at pixels (20, 12), token 1 + 6
    assert list(points.customdata[6]) == [result.layout.token_of(1, 2)] and (points.x[6], points.y[6]) == (20, 12)
    rectangle = figure.layout.shapes[0]  # the query, token 6 = patch (1,1), outlined
    assert (rectangle.x0, rectangle.y0, rectangle.x1, rectangle.y1) == (8, 8, 16, 16)
    assert len(figure.to_json()) < 2_000_000


def test_the_overlay_keeps_the_photo_readable(vision_checkpoint, photo):
    """Weight 0 is fully transparent; the opacity control scales the overlay; a head that spreads its weight evenly
    stays faint (the scale reaches 4x the uniform weight at least) instead of painting the whole photo; the per-head
    thumbnails carry the image (one small PNG) and outline the query's patch in every head."""
    from attnviz.viz.vision import OVERLAY_COLOURS, heads_overlay_figure, overlay_figure

    assert OVERLAY_COLOURS[0][1].endswith(",0)")  # rgba(…, 0): transparent at weight 0
    result = capture_image(load_model_dir(vision_checkpoint("vit")), photo)
    layout = result.layout
    uniform = np.full((layout.rows, layout.cols), 1 / (layout.rows * layout.cols))
    figure = overlay_figure(result.image, uniform, layout, 6, "uniform", opacity=0.5)
    heatmap = figure.data[1]
    assert heatmap.opacity == 0.5 and heatmap.zmin == 0
    assert heatmap.zmax == pytest.approx(4 / uniform.size)  # uniform weights sit at a quarter of the scale
    peaked = np.zeros_like(uniform)
    peaked[1, 2] = 0.9
    assert overlay_figure(result.image, peaked, layout, 6, "one patch").data[1].zmax == pytest.approx(0.9)
    grids = [vision.overlay(result, 0, "head", head, 6).grid for head in range(result.records["self"].n_heads)]
    small = heads_overlay_figure(grids, "heads", image=result.image, query_patch=layout.patch_of(6))
    images = [trace for trace in small.data if trace.type == "image"]
    assert len(images) == len(grids) and len({trace.source for trace in images}) == 1  # one PNG, drawn per head
    row, col = layout.patch_of(6)
    assert [(shape.x0, shape.y0) for shape in small.layout.shapes] == [(col - 0.5, row - 0.5)] * len(grids)
    assert len(small.to_json()) < 2_000_000


def test_a_checkpoint_without_a_processor_gets_a_marked_stand_in(vision_checkpoint, photo):
    bundle = load_model_dir(vision_checkpoint("vit", with_processor=False))
    assert "no preprocessor_config.json" in bundle.tokenizer_note and "0.5" in bundle.tokenizer_note
    pixels = vision.pixel_values(bundle.image_processor, photo)
    assert pixels.shape == (1, 3, 32, 32) and -1.0 <= float(pixels.min()) and float(pixels.max()) <= 1.0
    assert capture_image(bundle, photo).records["self"].n_q == 17


def _png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares ``width x height`` pixels: a decompression bomb's first bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
            + chunk(b"IEND", b""))


def test_images_are_validated_before_they_are_decoded(monkeypatch):
    assert vision.read_image(png(40, 30)).size == (40, 30)
    with pytest.raises(vision.ImageRefused, match="empty"):
        vision.read_image(b"")
    with pytest.raises(vision.ImageRefused, match="not an image"):
        vision.read_image(b"PK\x03\x04 a zip, renamed to photo.png")
    gif = io.BytesIO()
    Image.new("RGB", (8, 8)).save(gif, format="GIF")
    with pytest.raises(vision.ImageRefused, match="GIF image; upload a PNG or JPEG"):
        vision.read_image(gif.getvalue())
    with pytest.raises(vision.ImageRefused, match="8,000 x 8,000 pixels"):  # over attnviz's 40 MP, under PIL's
        vision.read_image(_png_declaring(8000, 8000))
    with pytest.raises(vision.ImageRefused, match="too many pixels|pixels"):  # past PIL's own bomb limit
        vision.read_image(_png_declaring(30000, 30000))
    jpeg = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(jpeg, "JPEG")
    with pytest.raises(vision.ImageRefused, match="could not be decoded"):
        vision.read_image(jpeg.getvalue()[:300])  # truncated
    monkeypatch.setattr(vision, "MAX_IMAGE_BYTES", 100)
    with pytest.raises(vision.ImageRefused, match="images up to"):
        vision.read_image(png(64, 64, (1, 2, 3)) + b"\x00" * 200)


def test_the_image_size_limit_is_worded_in_the_units_it_is_counted_in():
    limit = vision.MAX_IMAGE_BYTES  # 20 * 1024**2: 20 MiB, 20.97 MB
    data = png(64, 64, (1, 2, 3)) + b"\x00" * (limit + 1)
    with pytest.raises(vision.ImageRefused) as refused:
        vision.read_image(data)
    message = str(refused.value)
    assert f"{limit / 1024**2:g} MiB" in message and f"{limit:,} bytes" in message and f"{len(data):,} bytes" in message
    assert " MB" not in message  # a megabyte is 10^6 bytes: the limit is not 20 of those


@pytest.fixture
def vision_models(vision_checkpoint, clean_streamlit_caches):
    return {"all-MiniLM-L6-v2 (bundled BERT)": "unused", "tiny-deit": str(vision_checkpoint("deit"))}


def test_explore_heads_shows_a_vision_model_on_an_image(vision_models):
    at = open_page("app_pages/explore_heads.py", models=vision_models, model="tiny-deit")
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="explore_image_sample").value == "China (scikit-learn sample)"
    # the page's text box and sentence B are gone; the sidebar drops its sentence box for a model that reads
    # images (the rule below; the browser test sees the box gone)
    assert not any(t.key == "explore_pair" for t in at.text_input)
    assert folder_reads_images(vision_models["tiny-deit"]) and not folder_reads_images(default_model_dir())
    assert not any(w.key == "explore_source" for w in at.get("segmented_control"))
    titles = [spec["layout"]["title"]["text"] for spec in figures(at)]
    layer, head = at.number_input(key="layer").value, at.number_input(key="head").value
    assert any(t.startswith(f"Attention of [CLS]: layer {layer}, head {head};") for t in titles), titles
    assert any("Replay check" in m.value for m in at.markdown)
    at.selectbox(key="explore_image_query").set_value(2 + 5).run()  # patch (1,1), as a click on it sets
    titles = [spec["layout"]["title"]["text"] for spec in figures(at)]
    assert any(t.startswith("Attention of (1,1)") for t in titles), titles
    # One set of views on the Image tab: its own Heads choice, no View control whose Grid or Rollout did nothing here
    assert not any(w.key == "view" for w in at.get("segmented_control"))
    at.slider(key="explore_image_opacity").set_value(0.4).run()
    overlay = next(spec for spec in figures(at) if spec["layout"]["title"]["text"].startswith("Attention of"))
    assert overlay["data"][1]["opacity"] == 0.4
    at.segmented_control(key="explore_image_mode").set_value("mean").run()
    assert not any(w.key == "head" for w in at.number_input)  # no head to choose in a mean over heads
    at.segmented_control(key="explore_image_mode").set_value("rollout").run()
    assert at.number_input(key="layer").value == layer  # the same Layer box, labelled the same
    assert any(f"rollout through layers 0..{layer}" in spec["layout"]["title"]["text"] for spec in figures(at))
    at.segmented_control(key="explore_image_mode").set_value("head").run()
    assert at.number_input(key="head").value == head  # kept while hidden
    at.selectbox(key="explore_image_sample").set_value("Flower (scikit-learn sample)").run()
    assert not at.exception


def test_the_head_views_label_patches_and_text_pages_say_they_need_text(vision_models):
    at = open_page("app_pages/explore_heads.py", models=vision_models, model="tiny-deit", explore_image_tab="View")
    assert not at.exception, [e.value for e in at.exception]
    spec = figures(at)[0]
    assert "(0,0)" in str(spec["layout"]["xaxis"].get("ticktext", [])) + str(spec["data"][0].get("x", ""))
    at = open_page("app_pages/masks.py", models=vision_models, model="tiny-deit")
    assert not at.exception, [e.value for e in at.exception]
    assert any("vision transformer" in i.value for i in at.info)


@pytest.mark.parametrize("page", ["app_pages/step_by_step.py", "app_pages/masks.py", "app_pages/positional.py",
                                  "app_pages/scaling.py", "app_pages/heads_kv_cache.py", "app_pages/flash.py",
                                  "app_pages/generation.py", "app_pages/checkpoints.py"])
def test_every_other_page_survives_a_vision_model(vision_models, page):
    at = open_page(page, models=vision_models, model="tiny-deit", pos_tab="ALiBi")
    assert not at.exception, [e.value for e in at.exception]
    assert not [e.value for e in at.error if "several spellings" not in e.value]


def test_a_full_clip_checkpoint_is_read_through_its_vision_tower(tmp_path, photo):
    from transformers import CLIPConfig, CLIPModel, CLIPVisionModel, ViTImageProcessor

    torch.manual_seed(0)
    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    config = CLIPConfig(text_config=dict(sizes, vocab_size=100), projection_dim=16,
                        vision_config=dict(sizes, image_size=32, patch_size=8))
    folder = tmp_path / "clip"
    CLIPModel(config).save_pretrained(folder)  # text and vision towers, as openai/clip-* ship
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    bundle = load_model_dir(folder)
    assert bundle.modality == "image" and bundle.model_type == "clip_vision_model" and bundle.n_layers == 2
    record = capture_image(bundle, photo).records["self"]
    reference = CLIPVisionModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = reference(pixel_values=vision.pixel_values(bundle.image_processor, photo),
                             output_attentions=True).attentions
    torch.testing.assert_close(record.weights, torch.cat(expected), atol=1e-5, rtol=0)


def test_a_speech_model_is_refused_naming_its_type_and_why(tmp_path):
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    from attnviz.checkpoints.safety import CheckpointRefused

    config = Wav2Vec2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                            conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                            num_conv_pos_embedding_groups=4)
    Wav2Vec2Model(config).save_pretrained(tmp_path / "speech")
    with pytest.raises(CheckpointRefused, match="wav2vec2 models read raw audio, not text"):
        load_model_dir(tmp_path / "speech")


def test_phone_photos_are_read_upright_and_multi_picture_jpegs_accepted():
    picture = Image.new("RGB", (40, 20), (10, 200, 10))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to show it upright
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", exif=exif)
    assert vision.read_image(buffer.getvalue()).size == (20, 40)  # upright, as a phone shows it
    assert "MPO" in vision.FORMATS
