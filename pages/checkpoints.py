"""Checkpoints: bring your own model (zip, safetensors + config, or a folder on the server) and manage them."""

import os
import shutil

import streamlit as st

from attnviz.models import safety
from attnviz.models.loading import DEFAULT_MODEL_NAME
from attnviz.models.uploads import prepare_folder_path, prepare_single_files, prepare_zip
from attnviz.ui import load_bundle, register_model, registered_models, remove_model, start_page

INTRO = (
    "Add a Hugging Face model to inspect its heads: **encoders** (BERT, RoBERTa, DistilBERT), **decoders** (GPT-2, "
    "Llama with grouped-query attention) and **encoder-decoders** (BART, T5). Only `*.safetensors` weights are read; "
    "pickle files (`.bin`, `.pt`, `.pkl`) are never loaded and code in a checkpoint is never run."
)


def add_model(prepare, *args) -> None:
    """Prepare a folder, load it (which validates it), register it; show a message either way."""
    folder, owned, notes = None, False, []
    try:
        folder, owned, notes = prepare(*args)
        name = folder.name or "uploaded model"
        if str(folder) in registered_models().values():
            raise safety.CheckpointRefused("this folder is already loaded")
        bundle = load_bundle(str(folder), name)
        registered = register_model(name, folder, owned=owned)
        if registered != name:  # the cache key must match the registered name
            load_bundle.clear(str(folder), name)
    except safety.CheckpointRefused as problem:
        if folder is not None and owned:
            shutil.rmtree(folder.parent, ignore_errors=True)  # the temporary workspace of this upload
        st.error(f"Not loaded: {problem}.", icon=":material/block:")
        return
    # The sidebar's model widget already exists in this run: hand the new choice to the next run.
    st.session_state["pending_model"] = registered
    st.session_state["ckpt_messages"] = [f"Loaded **{registered}**: {bundle.describe()}. It is now the current model."]
    st.session_state["ckpt_messages"] += notes + ([bundle.tokenizer_note] if bundle.tokenizer_note else [])
    st.rerun()


def messages() -> None:
    """What the last upload or removal did (set before the rerun that shows it)."""
    for index, message in enumerate(st.session_state.pop("ckpt_messages", [])):
        (st.success if index == 0 else st.info)(message)


def add_forms() -> None:
    """Three ways to add a model: a zip, safetensors + config, or a folder on the server."""
    zip_tab, files_tab, folder_tab = st.tabs(["Upload a zip", "Upload safetensors + config", "Folder on this server"])
    with zip_tab:
        st.caption(
            "A zip of a model folder as `save_pretrained` writes it: config.json, *.safetensors, tokenizer files. "
            f"Up to {safety.MAX_UPLOAD_BYTES // 1024**2} MiB."
        )
        upload = st.file_uploader("Model zip", type=["zip"], key="ckpt_zip")
        if upload is not None and st.button("Load this zip", key="ckpt_zip_load", type="primary"):
            add_model(prepare_zip, upload.getvalue(), upload.name)
    with files_tab:
        st.caption("A single `.safetensors` file with its `config.json` (add tokenizer files too, if you have them).")
        files = st.file_uploader(
            "Files", type=["safetensors", "json", "txt", "model"], accept_multiple_files=True, key="ckpt_files"
        )
        if files and st.button("Load these files", key="ckpt_files_load", type="primary"):
            add_model(prepare_single_files, [(f.name, f.getvalue()) for f in files])
    with folder_tab:
        if os.environ.get("ATTNVIZ_SERVER_FOLDERS", "1") == "0":
            st.info("Loading folders from the server's disk is switched off on this deployment "
                    "(ATTNVIZ_SERVER_FOLDERS=0).")
        else:
            st.caption(
                "A model folder on the machine that runs this app (for example a local `save_pretrained` output). "
                "On a shared deployment, switch this off with ATTNVIZ_SERVER_FOLDERS=0."
            )
            typed = st.text_input("Folder path", key="ckpt_folder", placeholder="/path/to/model")
            if typed and st.button("Load this folder", key="ckpt_folder_load", type="primary"):
                add_model(prepare_folder_path, typed)


def loaded_models() -> None:
    st.subheader("Loaded models")
    for name, folder in list(registered_models().items()):
        columns = st.columns([5, 1])
        try:
            description = load_bundle(folder, name).describe()
        except safety.CheckpointRefused as problem:
            description = f"cannot be loaded: {problem}"
        current = " · **current**" if st.session_state.get("model", DEFAULT_MODEL_NAME) == name else ""
        columns[0].markdown(f"**{name}**{current}  \n{description}")
        if name != DEFAULT_MODEL_NAME and columns[1].button("Remove", key=f"ckpt_remove_{name}"):
            remove_model(name)
            st.rerun()


def main() -> None:
    start_page("Checkpoints")
    st.markdown(INTRO)
    messages()
    add_forms()
    loaded_models()


main()
