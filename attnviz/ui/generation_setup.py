"""The Generation page's setup area, drawn with Streamlit: the decoder it runs (the sidebar's model when it
generates) and the request form, whose settings become the request in use when its Generate button is pressed
(so typing never reruns the model)."""

import streamlit as st

from attnviz.models.loading import architecture_of_folder
from attnviz.models.shipped import BUNDLED_GPT_NAME
from attnviz.pagelogic.generation import decode as gen
from attnviz.pagelogic.generation.request import doubled
from attnviz.ui.caches.generation import REQUEST_DEFAULTS
from attnviz.ui.session_models import current_model_name, registered_models

MAX_NEW_TOKENS = 64
MAX_PROMPT_CHARS = 200_000  # a bound on what the box holds; the model reads what its positions allow (fit_prompt)

GENERATES = ("decoder", "encoder-decoder")


def choose_decoder() -> tuple[str, str] | None:
    """The model this page runs: the sidebar's model when it generates (a decoder or an encoder-decoder), else the
    bundled tiny GPT."""
    models = registered_models()
    decoders = {name: folder for name, folder in models.items() if architecture_of_folder(folder) in GENERATES}
    if not decoders:
        st.warning("No decoder is loaded: add one (GPT-2, Llama, T5, BART, ...) on the Checkpoints page.")
        return None
    sidebar = current_model_name()
    if sidebar not in decoders:
        kind = architecture_of_folder(models[sidebar]) or "not a decoder"
        st.info(f"The sidebar's model, **{sidebar}**, is an {kind}: it reads a whole text at once and does not "
                "generate. This page runs a decoder or an encoder-decoder.", icon=":material/info:")
    default = sidebar if sidebar in decoders else (BUNDLED_GPT_NAME if BUNDLED_GPT_NAME in decoders
                                                   else next(iter(decoders)))
    names = list(decoders)
    name = st.selectbox("Model", names, index=names.index(default), key="gen_model",
                        format_func=lambda n: f"{n} ({architecture_of_folder(decoders[n])})")
    return name, decoders[name]


def the_request() -> dict:
    """The settings in use (applied by the Generate button), kept in the session."""
    request = st.session_state.setdefault("gen_request", dict(REQUEST_DEFAULTS))
    for key, value in REQUEST_DEFAULTS.items():  # a request from an older session, or a test, may lack a setting
        request.setdefault(key, value)
    return request


def apply_form(repeat: bool = False) -> None:
    """Callback of the form's buttons (the form's values are in the session by now): the settings become the
    request; "Repeat my prompt" doubles the prompt first (in the box too)."""
    state = st.session_state
    prompt = state["gen_prompt"]
    if repeat:
        prompt = doubled(prompt)
        state["gen_prompt"] = prompt
    state["gen_request"].update(
        prompt=prompt, new_tokens=int(state["gen_count"]), strategy=state["gen_strategy"],
        temperature=float(state["gen_temperature"]), top_k=int(state["gen_top_k"]), top_p=float(state["gen_top_p"]),
        seed=int(state["gen_seed"]))


def request_form() -> dict:
    """The generation's settings, applied with the Generate button (so typing never reruns the model). The
    decoding choice is outside the form, so that the sampling controls are enabled at once when sampling is
    chosen (and greyed out under greedy decoding, where they change nothing)."""
    request = the_request()
    choice, top_k_column = st.columns([3, 1])
    strategy = choice.radio("Decoding", list(gen.STRATEGIES), format_func=gen.STRATEGIES.get,
                            index=list(gen.STRATEGIES).index(request["strategy"]), key="gen_strategy",
                            horizontal=True,
                            help="Applied with Generate. Greedy takes the most likely token; sampling draws from the "
                                 "distribution shaped by temperature, top-k and top-p, with the seed.")
    greedy = strategy == "greedy"
    off = " Greedy decoding ignores it: choose sampling to use it." if greedy else ""
    # Top-k is outside the form too: top-k 1 keeps only the most likely token, the draw is greedy, and temperature,
    # top-p and seed (greyed out at once) change nothing.
    top_k = top_k_column.number_input(
        "Top-k (0: off)", 0, 1000, request["top_k"], key="gen_top_k", disabled=greedy,
        help="Sampling only, applied with Generate: keep the k most likely tokens (1: the most likely, as greedy)."
             + off)
    only_one = not greedy and top_k == 1
    if only_one:
        off = " Top-k 1 keeps only the most likely token, so the draw is greedy: raise top-k to use it."
    with st.form("gen_form", border=False):
        # The widgets start from the settings in use (after a visit to another page they are drawn afresh).
        st.text_area(
            "Prompt", request["prompt"], key="gen_prompt", max_chars=MAX_PROMPT_CHARS, height=110,
            help="Any length, line breaks kept: the model reads as many tokens as its positions hold (with room "
                 "for the new tokens); a longer prompt is cut, and the page says where.")
        columns = st.columns([2, 3, 3, 2])
        columns[0].number_input("New tokens", 1, MAX_NEW_TOKENS, request["new_tokens"], key="gen_count")
        columns[1].slider("Temperature", 0.1, 2.0, request["temperature"], 0.1, key="gen_temperature",
                          disabled=greedy or only_one,
                          help="Sampling only: logits are divided by it before the softmax." + off)
        columns[2].slider("Top-p", 0.05, 1.0, request["top_p"], 0.05, key="gen_top_p", disabled=greedy or only_one,
                          help="Sampling only: keep the most likely tokens until their mass reaches p." + off)
        columns[3].number_input("Seed", 0, 10_000, request["seed"], key="gen_seed", disabled=greedy or only_one,
                                help="Sampling only: the random draws, repeatable." + off)
        buttons = st.columns([1, 2, 5])
        buttons[0].form_submit_button("Generate", type="primary", on_click=apply_form)
        buttons[1].form_submit_button(
            "Repeat my prompt", on_click=apply_form, args=(True,),
            help="Types the prompt twice, then generates. In the whole-sequence view below, an induction head sends "
                 "each token of the second copy to the token that followed it in the first.")
    if strategy != request["strategy"]:
        st.caption(":material/info: Press **Generate** to decode "
                   + ("greedily." if greedy else "by sampling (temperature, top-k, top-p, seed)."))
    st.button("One more token", key="gen_more", on_click=lambda: request.update(
        new_tokens=min(MAX_NEW_TOKENS, request["new_tokens"] + 1)), help="The same generation, one step longer.")
    return request
