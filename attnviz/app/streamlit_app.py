"""attnviz: see how transformer attention works. Run with `streamlit run app.py`.

`streamlit run` first reads this file's syntax tree for an ASGI app, finds `app` at the bottom, and has uvicorn
import the file and serve it; its lifespan starts loading the bundled model at once, before any browser connects.
Each browser session then runs this file as its script (`__name__ == "__main__"`): the navigation and the sidebar
of `main`.
"""

import time

from attnviz.system.runtime import configure_environment, optional_features
from attnviz.ui.lifespan import SESSION_RAN, server_lifespan

run_started = time.perf_counter()

import streamlit as st  # noqa: E402

PAGES = (  # (script, title, icon); the first is the default page
    ("app_pages/explore_heads.py", "Explore heads", ":material/search:"),
    ("app_pages/step_by_step.py", "Attention step by step", ":material/calculate:"),
    ("app_pages/masks.py", "Masks", ":material/grid_on:"),
    ("app_pages/positional.py", "Positional encodings", ":material/pin_drop:"),
    ("app_pages/scaling.py", "Scaling and softmax", ":material/functions:"),
    ("app_pages/heads_kv_cache.py", "Heads and KV cache", ":material/memory:"),
    ("app_pages/flash.py", "Flash vs naive", ":material/bolt:"),
    ("app_pages/generation.py", "Generation and KV cache", ":material/edit_note:"),
    ("app_pages/corpus.py", "Heads across a corpus", ":material/dataset:"),
    ("app_pages/importance.py", "Does this head matter?", ":material/science:"),
    ("app_pages/over_training.py", "Over training", ":material/timeline:"),
    ("app_pages/queries_keys.py", "Queries and keys", ":material/scatter_plot:"),
    ("app_pages/checkpoints.py", "Checkpoints", ":material/inventory_2:"),
)


def main() -> None:
    configure_environment()  # offline, and Triton's interpreter without a GPU: before transformers or triton load
    from attnviz.ui.frame import apply_presentation_mode, presentation_requested
    from attnviz.ui.links import drop_unusable_numbers
    from attnviz.ui.page_scripts import ASSETS, install_page_scripts
    from attnviz.ui.session_models import open_linked_model, show_notices
    from attnviz.ui.session_uploads import start_janitor
    from attnviz.ui.sidebar import keep_sidebar_choices

    drop_unusable_numbers()  # ?head=inf, ?layer=1e309: dropped before any widget reads the URL

    st.set_page_config(
        page_title="attnviz · attention, explained", page_icon=str(ASSETS / "icon.png"),
        layout="wide",
        initial_sidebar_state="collapsed" if presentation_requested() else "auto",  # a projector: all width to the page
    )
    pages = [st.Page(script, title=title, icon=icon, default=index == 0)
             for index, (script, title, icon) in enumerate(PAGES)]
    navigation = st.navigation(pages, expanded=True)  # every page listed: past ten, Streamlit hides the rest
    start_janitor()  # uploads are deleted soon after their session ends (or their browser's keep time)
    open_linked_model()  # a link's model=, before the sidebar's model widget reads the URL
    apply_pending_model()
    with st.sidebar:
        sidebar()
    keep_sidebar_choices()
    apply_presentation_mode(st.session_state.get("presentation_mode", False))
    install_page_scripts()
    show_notices()
    run_page(navigation, pages)


def apply_pending_model() -> None:
    """A model the Checkpoints page added or removed becomes the sidebar's (before its widget exists), and the
    sidebar gets back the choices this session last showed."""
    from attnviz.ui.session_models import registered_models
    from attnviz.ui.sidebar import restore_sidebar_choices

    pending = st.session_state.pop("pending_model", None)
    if pending in registered_models():
        st.session_state["model"] = pending
    restore_sidebar_choices(registered_models(), model_just_set=pending in registered_models())


def sidebar() -> None:
    """The global sidebar: the model and the sentence every page reads, presentation mode, this installation."""
    from attnviz.models.loading import folder_reads_images
    from attnviz.models.shipped import bundled_models
    from attnviz.ui.session_models import registered_models
    from attnviz.ui.sidebar import DEFAULT_SENTENCE, MAX_SENTENCE_CHARS, note_sidebar_edit

    bundled = list(bundled_models())
    named = " and ".join([", ".join(bundled[:-1]), bundled[-1]] if len(bundled) > 1 else bundled)
    st.selectbox(
        "Model", list(registered_models()), key="model", bind="query-params", on_change=note_sidebar_edit,
        args=("model",), help=f"The bundled model{'s' if len(bundled) > 1 else ''}: {named}; or a checkpoint you "
                              "added on the Checkpoints page.",
    )
    chosen = registered_models().get(st.session_state.get("model", ""))
    if chosen is not None and folder_reads_images(chosen):  # no text box that would do nothing: it reads images
        st.caption(":material/image: This model reads images, not a sentence: choose or upload an image on "
                   "**Explore heads**.")
    else:
        st.text_area(
            "Sentence", value=DEFAULT_SENTENCE, key="sentence", max_chars=MAX_SENTENCE_CHARS, height=100,
            bind="query-params", on_change=note_sidebar_edit, args=("sentence",),
            help="The text every page works on. Pages that need few tokens take the first words.",
        )
    st.toggle("Presentation mode", key="presentation_mode", bind="query-params",
              help="Larger text and figures for a projector, and the full width of the screen (close this "
                   "sidebar). Kept in the URL: a prepared link opens in presentation mode.")
    with st.expander("This installation"):
        for feature in optional_features():
            if feature.available:
                st.markdown(f":material/check: **{feature.package}** {feature.version or ''}: {feature.needed_for}.")
            else:
                st.markdown(f":material/block: **{feature.package}** is not installed: {feature.needed_for} is "
                            "unavailable.")


def run_page(navigation, pages) -> None:
    """The chosen page, then its story links; an exception no page caught becomes a message in words."""
    from attnviz.ui.frame import logged_run, story_links
    from attnviz.ui.messages import show_unexpected_error

    try:
        with logged_run(navigation.title, run_started):  # only with ATTNVIZ_RUN_LOG set: benchmarks, operators
            story_links({page.title: page for page in pages}, navigation.title, top=True)
            navigation.run()
            story_links({page.title: page for page in pages}, navigation.title)
    except Exception as problem:  # noqa: BLE001 - never a traceback in the page (st.stop and reruns pass through)
        show_unexpected_error(problem, navigation.title)
    finally:
        SESSION_RAN.set()  # however the run ended (st.stop and reruns end it by raising)


if __name__ == "__main__":  # a browser session's run
    main()
else:  # `streamlit run` looking for an ASGI app: this one, with the warm-up at server start
    from attnviz.ui.downloads import routes as download_routes

    app = st.App(__file__, lifespan=server_lifespan, routes=download_routes())  # + large exports, streamed
