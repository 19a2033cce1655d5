"""Checkpoints: bring your own model (zip, safetensors + config, or a folder on the server) and manage them."""


import streamlit as st

from attnviz.checkpoints import keep, safety
from attnviz.checkpoints.uploads import model_root, prepare_folder_path, prepare_single_files, prepare_zip
from attnviz.models import architectures
from attnviz.models.loading import MAX_PARAMETERS
from attnviz.models.record import DENSE_CELLS, DENSE_LIMIT, dense_token_limit
from attnviz.models.shipped import DEFAULT_MODEL_NAME, bundled_models
from attnviz.ui.frame import start_page
from attnviz.ui.loaded_models import load_bundle
from attnviz.ui.messages import problem_text
from attnviz.ui.session_models import (
    add_checkpoint,
    current_model_name,
    model_dtype,
    registered_models,
    remove_model,
    server_folders_allowed,
    upload_limit_bytes,
)

GENERATES_TOO = {"decoder": True, "encoder-decoder": True}  # architectures the Generation page runs
DTYPE_CHOICES = {"stored": "as stored (bf16 and fp16 stay half precision)", "fp32": "in fp32"}
INTRO = (
    "Add a Hugging Face model to inspect its heads. Only `*.safetensors` weights are read (sharded ones too); pickle "
    "files (`.bin`, `.pt`, `.pkl`) are never loaded and code in a checkpoint is never run."
)


def upload_limit_warning() -> None:
    if upload_limit_bytes() < safety.MAX_UPLOAD_BYTES:
        st.warning(
            f"Uploads are limited to {upload_limit_bytes() / 1024**2:.0f} MiB: this server was started outside the "
            "repository's folder, so Streamlit did not read its .streamlit/config.toml (which allows "
            f"{safety.MAX_UPLOAD_BYTES / 1024**3:g} GiB). Start it with `streamlit run app.py` from that folder.",
            icon=":material/upload_file:",
        )


def limits() -> None:
    st.markdown(
        "**Tested model types** (each loaded from a tiny checkpoint and checked against transformers' own attention "
        f"weights):\n\n{architectures.supported_markdown()}\n\nOther types that route attention through transformers' "
        "attention interface usually work; any other type is shown from transformers' eager weights, and Explore "
        "heads says which path a model took."
    )
    st.caption(
        f"Limits: uploads up to {upload_limit_bytes() / 1024**3:.3g} GiB; models up to "
        f"{MAX_PARAMETERS / 1e9:g}B parameters, in their stored dtype unless you ask for fp32; on a GPU the model runs "
        "there; weights larger than the free memory are offloaded to disk layer by layer (slow, but they load). Any "
        "text length the model reads: heatmaps above 256 tokens a side are pooled with a zoom, and the views that "
        f"need every head's weights at once (rollout, compare, what-if) {dense_views_limit()}"
    )
    hours = keep.keep_hours()
    st.caption(
        f"Models you add are kept for this browser until {hours:g} h after its last visit: a reload, or a link with "
        "`model=`, brings them back with their settings; no other browser sees them. Remove one to delete it."
        if hours else "Models you add stay with this session: they are deleted when it ends (this server keeps "
        "nothing, ATTNVIZ_KEEP_HOURS=0)."
    )


def dense_views_limit() -> str:
    """How long a text the views that hold every head's weights take, for the current model (its layers x heads
    x N^2 weights stay within DENSE_CELLS)."""
    rule = (f"at most {DENSE_LIMIT:,} tokens, and {DENSE_CELLS / 1e6:.0f} million weights in all (layers x heads x "
            "N²)")
    name = current_model_name()
    try:
        bundle = load_bundle(registered_models()[name], name, model_dtype(name))
    except Exception:  # noqa: BLE001 - a model that cannot load is listed below with its reason
        return f"work up to {rule}."
    return (f"work up to {dense_token_limit(bundle.n_layers, bundle.n_heads):,} tokens with {name} "
            f"({bundle.n_layers} layers x {bundle.n_heads} heads; {rule}).")


def add_model(prepare, *args) -> None:
    """Prepare a folder, load it (which validates it), register it; show each step while it runs, and a message
    either way."""
    dtype = st.session_state.get("ckpt_dtype", "stored")
    with st.status("Adding the model…", expanded=False) as status:
        try:
            registered, bundle, notes = add_checkpoint(prepare, *args, dtype=dtype,
                                                       progress=lambda text: status.update(label=text))
        except Exception as problem:  # noqa: BLE001 - whatever went wrong, the page says so and leaves nothing
            status.update(label="Not loaded", state="error")
            failed = problem
        else:
            status.update(label=f"Loaded {registered}", state="complete")
            failed = None
    if failed is not None:
        reason = (failed if isinstance(failed, safety.CheckpointRefused)
                  else f"it could not be read ({problem_text(failed)})")
        st.error(f"Not loaded: {reason}.", icon=":material/block:")
        return
    # The sidebar's model widget already exists in this run: hand the new choice to the next run.
    st.session_state["pending_model"] = registered
    st.session_state["ckpt_messages"] = [f"Loaded **{registered}**: {bundle.describe()}. It is now the current model."]
    st.session_state["ckpt_messages"] += notes + ([bundle.tokenizer_note] if bundle.tokenizer_note else [])
    st.session_state["ckpt_onward"] = GENERATES_TOO.get(bundle.architecture, False) and bundle.modality == "text"
    if bundle.nonfinite or bundle.nonfinite_outputs:
        st.session_state["ckpt_messages"].append(nonfinite_warning(bundle))
    st.rerun()


def nonfinite_warning(bundle) -> str:
    parts = []
    if bundle.nonfinite:
        names = ", ".join(f"`{name}`" for name in bundle.nonfinite[:3]) + (" …" if len(bundle.nonfinite) > 3 else "")
        parts.append(f"{len(bundle.nonfinite)} weight tensor(s) hold NaN or infinity ({names})")
    if bundle.nonfinite_outputs:
        parts.append(f"{bundle.nonfinite_outputs} hold NaN or infinity")
    return (f":material/warning: **Not finite:** {'; '.join(parts)}. The model loaded, but its attention and outputs "
            "may be NaN; every page says so where they are.")


def messages() -> None:
    """What the last upload or removal did (set before the rerun that shows it), and after a load the way on: the
    new model's heads, and its generation where it writes text."""
    shown = st.session_state.pop("ckpt_messages", [])
    for index, message in enumerate(shown):
        if message.startswith(":material/warning:"):
            st.warning(message.removeprefix(":material/warning:").strip(), icon=":material/warning:")
        else:
            (st.success if index == 0 else st.info)(message)
    generates = st.session_state.pop("ckpt_onward", None)
    if shown and generates is not None:
        left, right = st.columns(2)
        left.page_link("app_pages/explore_heads.py", label="Explore its heads →", icon=":material/search:")
        if generates:
            right.page_link("app_pages/generation.py", label="Watch it generate →", icon=":material/edit_note:")


def add_forms() -> None:
    """Three ways to add a model: a zip, safetensors + config, or a folder on the server."""
    st.radio(
        "Load the weights", list(DTYPE_CHOICES), format_func=DTYPE_CHOICES.get, horizontal=True, key="ckpt_dtype",
        help="A bf16 checkpoint kept in bf16 needs half the memory of fp32; replay always computes in fp32.",
    )
    zip_tab, files_tab, folder_tab = st.tabs(["Upload a zip", "Upload safetensors + config", "Folder on this server"])
    with zip_tab:
        st.caption(
            "A zip of a model folder as `save_pretrained` writes it: config.json, *.safetensors (sharded ones with "
            f"their index), tokenizer files. Up to {upload_limit_bytes() / 1024**3:.3g} GiB; while it is read the "
            "upload is held in the server's memory, so a 2 GiB zip needs 2 GiB of RAM besides the model."
        )
        upload = st.file_uploader("Model zip", type=["zip"], key="ckpt_zip")
        if upload is not None and st.button("Load this zip", key="ckpt_zip_load", type="primary"):
            add_model(prepare_zip, upload, upload.name)
    with files_tab:
        st.caption("The `.safetensors` file (or all the shards of a sharded checkpoint, with "
                   "`model.safetensors.index.json`) and `config.json`; add tokenizer files too, if you have them.")
        files = st.file_uploader(
            "Files", type=["safetensors", "json", "txt", "model"], accept_multiple_files=True, key="ckpt_files"
        )
        if files and st.button("Load these files", key="ckpt_files_load", type="primary"):
            add_model(prepare_single_files, [(f.name, f) for f in files])
    with folder_tab:
        if not server_folders_allowed():
            st.info("Loading folders from the server's disk is switched off on this deployment "
                    "(ATTNVIZ_SERVER_FOLDERS=0).")
        else:
            root = model_root()
            st.caption(
                "A model folder on the machine that runs this app (for example a local `save_pretrained` output). "
                + (f"On this server, folders are read from inside {root}." if root else
                   "On a shared deployment, set ATTNVIZ_MODEL_ROOT to the folder models may be read from, or switch "
                   "this off with ATTNVIZ_SERVER_FOLDERS=0.")
            )
            typed = st.text_input("Folder path", key="ckpt_folder", placeholder="/path/to/model")
            if typed and st.button("Load this folder", key="ckpt_folder_load", type="primary"):
                add_model(prepare_folder_path, typed)


def loaded_models() -> None:
    st.subheader("Loaded models")
    for name, folder in list(registered_models().items()):
        columns = st.columns([5, 1])
        try:
            description = load_bundle(folder, name, model_dtype(name)).describe()
        except Exception as problem:  # noqa: BLE001 - refused, or anything else: said in words
            description = f"cannot be loaded: {problem_text(problem)}"
        current = " · **current**" if st.session_state.get("model", DEFAULT_MODEL_NAME) == name else ""
        columns[0].markdown(f"**{name}**{current}  \n{description}")
        if name not in bundled_models() and columns[1].button("Remove", key=f"ckpt_remove_{name}"):
            remove_model(name)
            st.rerun()


def main() -> None:
    start_page("Checkpoints")
    st.markdown(INTRO)
    messages()
    upload_limit_warning()
    add_forms()  # the upload first; what the server accepts is one click away
    with st.expander("Tested model types and limits", icon=":material/checklist:"):
        limits()
    loaded_models()


main()
