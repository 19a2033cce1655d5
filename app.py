"""attnviz: see how transformer attention works. Run with `streamlit run app.py`.

`streamlit run` first reads this file's syntax tree for an ASGI app, finds `app` at the bottom, and has uvicorn
import the file and serve it; its lifespan starts loading the bundled model at once, before any browser connects.
Each browser session then runs this file as its script (`__name__ == "__main__"`): the navigation and the sidebar
of `main`.
"""

import time
from pathlib import Path

from attnviz.runtime import SESSION_RAN, configure_environment, optional_features, server_lifespan

run_started = time.perf_counter()

import streamlit as st  # noqa: E402


def main() -> None:
    configure_environment()  # offline, and Triton's interpreter without a GPU: before transformers or triton load
    from attnviz.ui import (
        DEFAULT_SENTENCE,
        MAX_SENTENCE_CHARS,
        apply_presentation_mode,
        install_page_scripts,
        keep_sidebar_choices,
        logged_run,
        note_sidebar_edit,
        open_linked_model,
        presentation_requested,
        registered_models,
        restore_sidebar_choices,
        show_notices,
        show_unexpected_error,
        start_janitor,
        story_links,
    )

    st.set_page_config(
        page_title="attnviz · attention, explained", page_icon=str(Path(__file__).parent / "assets" / "icon.png"),
        layout="wide",
        initial_sidebar_state="collapsed" if presentation_requested() else "auto",  # a projector: all width to the page
    )

    pages = [
        st.Page("pages/explore_heads.py", title="Explore heads", icon=":material/search:", default=True),
        st.Page("pages/step_by_step.py", title="Attention step by step", icon=":material/calculate:"),
        st.Page("pages/masks.py", title="Masks", icon=":material/grid_on:"),
        st.Page("pages/positional.py", title="Positional encodings", icon=":material/pin_drop:"),
        st.Page("pages/scaling.py", title="Scaling and softmax", icon=":material/functions:"),
        st.Page("pages/heads_kv_cache.py", title="Heads and KV cache", icon=":material/memory:"),
        st.Page("pages/flash.py", title="Flash vs naive", icon=":material/bolt:"),
        st.Page("pages/generation.py", title="Generation and KV cache", icon=":material/edit_note:"),
        st.Page("pages/checkpoints.py", title="Checkpoints", icon=":material/inventory_2:"),
    ]
    navigation = st.navigation(pages)
    start_janitor()  # uploads are deleted soon after their session ends (or their browser's keep time)
    open_linked_model()  # a link's model=, before the sidebar's model widget reads the URL

    pending = st.session_state.pop("pending_model", None)  # set by the Checkpoints page (upload or removal)
    if pending in registered_models():
        st.session_state["model"] = pending
    restore_sidebar_choices(registered_models(), model_just_set=pending in registered_models())

    with st.sidebar:
        models = list(registered_models())
        st.selectbox(
            "Model", models, key="model", bind="query-params", on_change=note_sidebar_edit, args=("model",),
            help="The bundled BERT, or a checkpoint you added on the Checkpoints page.",
        )
        st.text_area(
            "Sentence",
            value=DEFAULT_SENTENCE,
            key="sentence",
            max_chars=MAX_SENTENCE_CHARS,
            height=100,
            bind="query-params",
            on_change=note_sidebar_edit,
            args=("sentence",),
            help="The text every page works on. Pages that need few tokens take the first words.",
        )
        st.toggle("Presentation mode", key="presentation_mode", bind="query-params",
                  help="Larger text and figures for a projector, and the full width of the screen (close this "
                       "sidebar). Kept in the URL: a prepared link opens in presentation mode.")
        with st.expander("This installation"):
            for feature in optional_features():
                if feature.available:
                    st.markdown(f":material/check: **{feature.package}** {feature.version or ''}: "
                                f"{feature.needed_for}.")
                else:
                    st.markdown(
                        f":material/block: **{feature.package}** is not installed: {feature.needed_for} is unavailable."
                    )

    keep_sidebar_choices()
    apply_presentation_mode(st.session_state.get("presentation_mode", False))
    install_page_scripts()
    show_notices()
    try:
        with logged_run(navigation.title, run_started):  # only with ATTNVIZ_RUN_LOG set: benchmarks, operators
            navigation.run()
            story_links({page.title: page for page in pages}, navigation.title)
    except Exception as problem:  # noqa: BLE001 - never a traceback in the page (st.stop and reruns pass through)
        show_unexpected_error(problem, navigation.title)
    finally:
        SESSION_RAN.set()  # however the run ended (st.stop and reruns end it by raising)


if __name__ == "__main__":  # a browser session's run
    main()
else:  # `streamlit run app.py` looking for an ASGI app: this one, with the warm-up at server start
    app = st.App(__file__, lifespan=server_lifespan)
