"""The Streamlit app and the ``attnviz`` command: the top layer, over everything else.

- ``streamlit_app``: the app's script (navigation, the global sidebar, the page run), with the server's ASGI app
  (the warm-up at start, the streamed downloads); :data:`SCRIPT` is its path
- ``app_pages``: one thin script per page (widgets, calls into the package, figures); not named ``pages/``, which
  Streamlit reads as its legacy multipage mode
- ``.streamlit/config.toml``: the server's settings (upload limit, theme), read by Streamlit beside the script
- ``command``: ``attnviz serve | scan | importance | bench | train-tiny``, the installed command

From a checkout, ``streamlit run app.py`` serves the same script (the repository's ``app.py`` only points here).
"""

from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "streamlit_app.py"
