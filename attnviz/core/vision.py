"""Vision transformers: images in, patch tokens out, and attention drawn back onto the image.

A ViT cuts the image into ``patch x patch`` squares; each becomes a token, after a ``[CLS]`` token (DeiT adds a
distillation token, DINOv2 may add register tokens, SigLIP has none). attnviz captures their attention exactly as
for text (the models call transformers' attention interface), and labels the tokens ``[CLS]`` and ``(row, col)``
so every head view reads as for text, plus overlays of one query's attention on the image.

Uploaded images are untrusted: :func:`read_image` checks the size in bytes, the format (PNG or JPEG, by content,
not by name) and the pixel count (read from the header, before anything is decoded: a decompression bomb is
refused without being expanded).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch

from attnviz.core.units import human_bytes

MAX_IMAGE_BYTES = 20 * 1024**2  # 20 MiB; a photo from a phone is 2-8 MB
MAX_IMAGE_PIXELS = 40_000_000  # a 40-megapixel camera; a bomb declares far more than its bytes hold
# What a model may be shown: real processors resize to 224-518 pixels a side (DINOv2: 518, 1,370 tokens). A
# processor config that asks for more (a crafted size of 20,000) would take gigabytes and hours per image.
MAX_MODEL_IMAGE_SIDE = 4096
MAX_IMAGE_TOKENS = 16_384
FORMATS = ("PNG", "JPEG", "MPO")  # MPO: a JPEG with more pictures in it (phones' HDR gain maps), read as JPEG
SAMPLE_IMAGES = {"China (scikit-learn sample)": "china.jpg", "Flower (scikit-learn sample)": "flower.jpg"}
UPLOAD_HINT = ("No pretrained vision checkpoint ships offline. For a real one, upload a zip of a Hugging Face ViT "
               "folder on the Checkpoints page, e.g. google/vit-base-patch16-224 (346 MB), facebook/deit-small-"
               "patch16-224, facebook/dinov2-small or a CLIP vision model.")


class ImageRefused(ValueError):
    """An image that is not a readable PNG or JPEG within the limits; the message says why."""


def read_image(data: bytes):
    """The RGB ``PIL.Image`` of an uploaded file, or :class:`ImageRefused` with the reason."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise ImageRefused("the file is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageRefused(f"the file is {human_bytes(len(data))} ({len(data):,} bytes); images up to "
                           f"{human_bytes(MAX_IMAGE_BYTES)} ({MAX_IMAGE_BYTES:,} bytes) are read")
    try:
        image = Image.open(io.BytesIO(data))  # reads the header only
    except UnidentifiedImageError:
        raise ImageRefused("this is not an image PIL can read; upload a PNG or JPEG") from None
    except Image.DecompressionBombError as problem:
        raise ImageRefused(f"the image declares too many pixels ({problem})") from None
    except (OSError, ValueError, SyntaxError) as problem:  # PIL's header parsers raise these on a broken file
        raise ImageRefused(f"the image could not be decoded ({str(problem)[:120]})") from None
    if image.format not in FORMATS:
        raise ImageRefused(f"the file is a {image.format or 'unknown'} image; upload a PNG or JPEG")
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageRefused(f"the image declares {width:,} x {height:,} pixels ({width * height / 1e6:.0f} MP); "
                           f"images up to {MAX_IMAGE_PIXELS / 1e6:.0f} MP are read (a decompression bomb is refused "
                           "before it is decoded)")
    if width < 1 or height < 1:
        raise ImageRefused("the image has no pixels")
    try:
        from PIL import ImageOps

        return ImageOps.exif_transpose(image).convert("RGB")  # decodes (a truncated file fails here), upright
    except (OSError, ValueError, Image.DecompressionBombError) as problem:
        raise ImageRefused(f"the image could not be decoded ({str(problem)[:120]})") from None


def sample_image(name: str):
    """One of scikit-learn's bundled sample photos (offline) as an RGB ``PIL.Image``."""
    from PIL import Image
    from sklearn.datasets import load_sample_image

    return Image.fromarray(load_sample_image(SAMPLE_IMAGES[name]))


def png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass(frozen=True)
class PatchLayout:
    """How a vision transformer's tokens map onto the image: ``prefix`` tokens (``[CLS]``, ...) then a
    ``rows x cols`` grid of patches, row by row."""

    prefix: tuple[str, ...]
    rows: int
    cols: int
    patch: int  # pixels per patch side, at the model's input size
    image_size: tuple[int, int]  # (height, width) the model read, in pixels

    @property
    def n_tokens(self) -> int:
        return len(self.prefix) + self.rows * self.cols

    def labels(self) -> list[str]:
        return list(self.prefix) + [f"({r},{c})" for r in range(self.rows) for c in range(self.cols)]

    def token_of(self, row: int, col: int) -> int:
        return len(self.prefix) + row * self.cols + col

    def patch_of(self, token: int) -> tuple[int, int] | None:
        """(row, col) of a patch token, None for a prefix token."""
        index = token - len(self.prefix)
        return None if index < 0 else divmod(index, self.cols)


def layout_of(config, n_tokens: int, height: int, width: int,
              prefix_names: tuple[str, ...] = ("[CLS]",)) -> PatchLayout:
    """The token layout of a vision model of ``config`` that read ``height x width`` pixels as ``n_tokens``
    tokens. The tokens before the patches are named ``prefix_names`` when there are that many (the model's own:
    DeiT's ``[CLS]``, ``[DIST]``), else ``[CLS]`` and register tokens."""
    patch = int(config.patch_size if not isinstance(config.patch_size, (tuple, list)) else config.patch_size[0])
    rows, cols = height // patch, width // patch
    n_prefix = n_tokens - rows * cols
    if n_prefix < 0:
        raise ValueError(f"{n_tokens} tokens cannot hold a {rows} x {cols} grid of patches")
    if n_prefix == len(prefix_names):
        prefix = tuple(prefix_names)
    else:
        prefix = () if n_prefix == 0 else ("[CLS]",) + tuple(f"[REG {i}]" for i in range(n_prefix - 1))
    return PatchLayout(prefix, rows, cols, patch, (height, width))


def test_image():
    """A small grey picture, as a processor is tried on at load."""
    from PIL import Image

    return Image.new("RGB", (64, 48), (128, 128, 128))


def image_tokens(config, height: int, width: int) -> int:
    """How many tokens a vision model of ``config`` makes of ``height x width`` pixels (without its prefix)."""
    patch = config.patch_size if not isinstance(config.patch_size, (tuple, list)) else config.patch_size[0]
    return (height // max(1, int(patch))) * (width // max(1, int(patch)))


def check_pixels(pixels: torch.Tensor, config) -> None:
    """Refuse, in words, pixels a model should not be shown: not ``[1, channels, H, W]``, not finite, or so large
    that the model would read more than :data:`MAX_IMAGE_TOKENS` patches."""
    channels = int(getattr(config, "num_channels", 3) or 3)
    if pixels.dim() != 4 or pixels.shape[0] != 1 or pixels.shape[1] != channels:
        raise ValueError(f"the image processor gives pixels shaped {list(pixels.shape)}, not [1, {channels}, H, W]")
    height, width = pixels.shape[-2:]
    if max(height, width) > MAX_MODEL_IMAGE_SIDE or image_tokens(config, height, width) > MAX_IMAGE_TOKENS:
        raise ValueError(f"the image processor makes the image {width} x {height} pixels, "
                         f"{image_tokens(config, height, width):,} patches; attnviz shows models up to "
                         f"{MAX_MODEL_IMAGE_SIDE:,} pixels a side and {MAX_IMAGE_TOKENS:,} patches")
    if not bool(torch.isfinite(pixels).all()):
        raise ValueError("the image processor gives pixels that are NaN or infinite (its mean or std?)")


def pixel_values(processor, image) -> torch.Tensor:
    """``[1, 3, H, W]`` float pixels for the model."""
    return torch.as_tensor(processor(images=image, return_tensors="pt")["pixel_values"])


def seen_image(pixels: torch.Tensor, processor) -> np.ndarray:
    """The image as the model saw it (resized, cropped), ``[H, W, 3]`` uint8: ``pixels [1, 3, H, W]`` with the
    processor's normalisation undone."""
    mean = torch.tensor(getattr(processor, "image_mean", None) or [0.5] * 3, dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(getattr(processor, "image_std", None) or [0.5] * 3, dtype=torch.float32).view(3, 1, 1)
    if not getattr(processor, "do_normalize", True):
        mean, std = torch.zeros(3, 1, 1), torch.ones(3, 1, 1)
    rescaled = pixels[0].float().cpu() * std + mean  # [3, H, W], in 0..1
    return (rescaled.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()


def attention_grid(weights_row: torch.Tensor, layout: PatchLayout) -> np.ndarray:
    """One query's weights over all tokens ``[n_k]`` -> the share on each patch ``[rows, cols]`` (the prefix
    tokens' share is left out of the picture; :func:`prefix_share` says how much it is)."""
    patches = weights_row[len(layout.prefix):].float()
    return patches.reshape(layout.rows, layout.cols).numpy()


def prefix_share(weights_row: torch.Tensor, layout: PatchLayout) -> float:
    return float(weights_row[: len(layout.prefix)].sum())



OVERLAY_MODES = ("head", "mean", "rollout")
OVERLAY_NAMES = {"head": "This head", "mean": "Mean over heads", "rollout": "Rollout"}


@dataclass
class Overlay:
    grid: np.ndarray  # [rows, cols]: the query's weight on each patch
    prefix_share: float  # what it puts on [CLS] and the other prefix tokens (not drawn on the image)
    title: str


def overlay(capture, layer: int, mode: str, head: int, query: int) -> Overlay:
    """One query's attention on the image: ``mode`` "head" (layer, head), "mean" (over the layer's heads) or
    "rollout" (Abnar and Zuidema's rollout through layers 0..layer, the usual ViT saliency)."""
    from attnviz.core import analysis

    record, layout = capture.records["self"], capture.layout
    if mode == "head":
        row = record.head_weights(layer, head, query, query + 1)[0]  # [n_k]
        what = f"layer {layer}, head {head}"
    elif mode == "mean":
        row = record.layer_weights(layer, query, query + 1).mean(0)[0]  # mean over heads: [n_k]
        what = f"layer {layer}, mean of {record.n_heads} heads"
    elif mode == "rollout":
        row = analysis.attention_rollout(record.weights)[layer][query]
        what = f"rollout through layers 0..{layer}"
    else:
        raise ValueError(f"mode must be one of {OVERLAY_MODES}, got {mode!r}")
    name = capture.tokens[query]
    prefix = prefix_share(row, layout)
    note = f"; {prefix:.0%} on {', '.join(layout.prefix)} (not drawn)" if layout.prefix else ""
    return Overlay(attention_grid(row, layout), prefix, f"Attention of {name}: {what}{note}")


def token_at_pixel(layout: PatchLayout, x: float, y: float) -> int | None:
    """The patch token under pixel ``(x, y)`` of the image the model saw, None outside it."""
    height, width = layout.image_size
    if not (0 <= x < width and 0 <= y < height):
        return None
    row, col = int(y // layout.patch), int(x // layout.patch)
    if row >= layout.rows or col >= layout.cols:
        return None
    return layout.token_of(row, col)
