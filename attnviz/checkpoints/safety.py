"""The refusal every checkpoint check raises, and the limits they share.

What is checked where: :mod:`attnviz.checkpoints.uploads` turns an upload into a folder (a zip is extracted member by
member, only the files a model needs); :mod:`attnviz.checkpoints.preflight` checks every file transformers will read
in a folder before it reads any; :mod:`attnviz.checkpoints.disk` bounds what uploads take on disk. Nothing unpickles
(no .bin/.pt/.pkl weights) and nothing allows ``trust_remote_code``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

STREAMLIT_CONFIG = Path(__file__).resolve().parents[1] / "app" / ".streamlit" / "config.toml"  # beside the app script


def _configured_upload_bytes() -> int:
    """The upload limit, set in one place: ``server.maxUploadSize`` of .streamlit/config.toml (Streamlit's
    megabytes are MiB). Streamlit refuses larger uploads itself; attnviz checks the same number."""
    with open(STREAMLIT_CONFIG, "rb") as config:
        return int(tomllib.load(config)["server"]["maxUploadSize"]) * 1024**2


MAX_UPLOAD_BYTES = _configured_upload_bytes()
MAX_EXTRACTED_BYTES = 2 * MAX_UPLOAD_BYTES  # safetensors hardly compress: a zip unpacks to about its own size
MAX_MEMBERS = 200

MAX_NAME_BYTES = 255  # a file name longer than this cannot be created on common file systems

PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy"}
ARCHIVE_SUFFIXES = {".zip", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".7z", ".rar"}
CODE_SUFFIXES = {".py", ".pyc", ".so", ".sh", ".ipynb"}


class CheckpointRefused(ValueError):
    """A checkpoint (or upload) that attnviz will not load; the message says why and what to do."""


def first_line(problem: BaseException, limit: int = 200) -> str:
    """An exception's first line, shortened (its type's name when it has no message): what a refusal quotes."""
    text = str(problem).strip()
    return text.splitlines()[0][:limit] if text else type(problem).__name__
