"""A vision checkpoint's image processor: its own (``preprocessor_config.json``, read by transformers, no code
from the checkpoint) once its sizes and a trial image show it safe to use, else a marked stand-in."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from attnviz.core import vision


class FallbackImageProcessor:
    """For a checkpoint without ``preprocessor_config.json``: resize to the model's square and normalise with
    mean = std = 0.5 (ViT's defaults). The page says the checkpoint's own processor was not found."""

    def __init__(self, image_size: int):
        self.image_size = image_size

    def __call__(self, images, return_tensors="pt"):
        from PIL import Image

        resized = images.convert("RGB").resize((self.image_size, self.image_size), Image.BICUBIC)
        array = np.asarray(resized, dtype=np.float32) / 255.0  # [H, W, 3]
        pixels = torch.from_numpy((array - 0.5) / 0.5).permute(2, 0, 1)[None]  # [1, 3, H, W]
        return {"pixel_values": pixels}


def load_image_processor(folder, config) -> tuple[object, str | None]:
    """The folder's own image processor (no code from the checkpoint), or a marked stand-in: ``(processor,
    note)``."""
    from transformers import AutoImageProcessor

    size = int(config.image_size if not isinstance(config.image_size, (tuple, list)) else config.image_size[0])
    if (Path(folder) / "preprocessor_config.json").is_file():
        try:
            processor = AutoImageProcessor.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
            problem = processor_problem(processor, config)
            if problem is None:
                return processor, None
            note = f"Its preprocessor_config.json cannot be used ({problem})"
        except Exception as problem:  # noqa: BLE001 - any failure means: use the stand-in, and say so
            note = f"Its preprocessor_config.json could not be read ({str(problem)[:120]})"
    else:
        note = "This checkpoint has no preprocessor_config.json"
    return FallbackImageProcessor(size), (f"{note}: images are resized to {size} x {size} and normalised with mean "
                                          "and std 0.5 (ViT's defaults), which may not be how this model was trained.")


SIZE_SETTINGS = ("size", "crop_size", "pad_size", "max_size")  # what a processor resizes, crops or pads to


def _sizes(value, key: str = "") -> list[tuple[str, object]]:
    """Every number in a processor's size setting, with its key: a number, a dict, a list or transformers'
    ``SizeDict`` (a dataclass of height, width, edges and pixel counts)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return [pair for name, item in value.items() for pair in _sizes(item, str(name))]
    if isinstance(value, (list, tuple)):
        return [pair for item in value for pair in _sizes(item, key)]
    return [] if value is None else [(key, value)]


def processor_problem(processor, config) -> str | None:
    """Why a checkpoint's image processor cannot be used (None if it can). Its sizes are read first (a crafted
    size of 20,000 would allocate gigabytes on the first image, this test's included); then, tried on a small
    grey image, it must give ``[1, channels, H, W]`` finite pixels of a size the model can read in bounded time."""
    for name in (*SIZE_SETTINGS, "max_pixels", "min_pixels"):
        for key, size in _sizes(getattr(processor, name, None), name):
            largest = vision.MAX_MODEL_IMAGE_SIDE**2 if "pixels" in key else vision.MAX_MODEL_IMAGE_SIDE
            if isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 < size <= largest:
                return (f"its {name} {key if key != name else ''} is {str(size)[:30]}; attnviz shows models "
                        f"images of 1 to {vision.MAX_MODEL_IMAGE_SIDE:,} pixels a side").replace("  ", " ")
    try:
        vision.check_pixels(vision.pixel_values(processor, vision.test_image()), config)
    except Exception as problem:  # noqa: BLE001 - whatever the processor raises: it cannot be used
        return str(problem)[:160] or type(problem).__name__
    return None
