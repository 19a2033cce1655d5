"""Downloads too large to hold in memory (a scan's table as Parquet can be hundreds of MB): the page writes the file
to disk and offers it here; app.py's route (:func:`routes`, ``/attnviz-download/<token>``) streams it to the
browser from the file. Streamlit's own download button would keep the whole file in the server's memory.

A token is 128 random bits, known only to the session that prepared the file; it is good for a limited time
(the file is then deleted, by :func:`sweep` or the next offer of the same session).
"""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path

DOWNLOAD_PREFIX = "/attnviz-download/"
_OFFERS: dict[str, tuple[Path, str, float]] = {}  # token -> (file, name the browser saves it as, expiry)
_LOCK = threading.Lock()


def offer(path: Path, file_name: str, seconds: float) -> tuple[str, str]:
    """Offer ``path`` for ``seconds``: (token, the link the page shows)."""
    sweep()
    token = secrets.token_urlsafe(16)
    with _LOCK:
        _OFFERS[token] = (Path(path), file_name, time.time() + seconds)
    return token, f"{_base_path()}{DOWNLOAD_PREFIX}{token}"


def withdraw(token: str | None) -> None:
    """An offer ended now, its file deleted."""
    with _LOCK:
        found = _OFFERS.pop(token, None) if token else None
    if found is not None:
        found[0].unlink(missing_ok=True)


def offered(token: str) -> tuple[Path, str] | None:
    """The file and name a token offers now, or None."""
    with _LOCK:
        found = _OFFERS.get(token)
    if found is None or found[2] < time.time() or not found[0].is_file():
        return None
    return found[0], found[1]


def sweep() -> None:
    """Offers past their time ended, their files deleted."""
    now = time.time()
    with _LOCK:
        expired = [token for token, (_, _, until) in _OFFERS.items() if until < now]
    for token in expired:
        withdraw(token)


def _base_path() -> str:
    try:
        from streamlit import config

        base = (config.get_option("server.baseUrlPath") or "").strip("/")
    except Exception:  # noqa: BLE001 - no Streamlit configuration here
        base = ""
    return f"/{base}" if base else ""


async def _serve(request):
    from starlette.responses import FileResponse, PlainTextResponse

    found = offered(request.path_params["token"])
    if found is None:
        return PlainTextResponse("This download has expired or does not exist: prepare it again on the page.",
                                 status_code=404)
    path, name = found
    return FileResponse(path, filename=name, media_type="application/octet-stream")  # streamed, 64 KB at a time


def routes() -> list:
    """The route app.py's ``st.App`` serves downloads at."""
    from starlette.routing import Route

    return [Route(f"{_base_path()}{DOWNLOAD_PREFIX}{{token}}", _serve, methods=["GET"])]
