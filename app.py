"""attnviz from a checkout: `streamlit run app.py` serves the app's script, attnviz/app/streamlit_app.py (what
`attnviz serve` runs once the package is installed), with the warm-up at server start and the streamed downloads.

Streamlit reads this file's syntax tree, finds the ASGI app below and has uvicorn import it; every browser session
then runs the app's script itself. Its settings are .streamlit/config.toml here, a copy of the app's own (a test
keeps the two equal).
"""

import streamlit as st

from attnviz.app import SCRIPT
from attnviz.ui.downloads import routes as download_routes
from attnviz.ui.lifespan import server_lifespan

app = st.App(SCRIPT, lifespan=server_lifespan, routes=download_routes())
