"""Queries and keys in one picture: a head's query and key vectors as points of one space, where a query lies near
the keys it attends to (AttentionViz, Yeh et al. 2023), on any checkpoint attnviz reads."""

import streamlit as st

from attnviz.pagelogic import qkmap
from attnviz.scan.corpus import bundled_corpus
from attnviz.ui.captures import capture_current
from attnviz.ui.figures import show_figure
from attnviz.ui.frame import page_intro, start_page
from attnviz.ui.messages import queries_unavailable
from attnviz.ui.open_in_explore import ask_to_open, switch_if_asked
from attnviz.ui.qkmap_cache import (
    cached_points,
    cached_projection,
    corpus_records,
    layer_pictures,
)
from attnviz.ui.session_models import current_model_name, model_dtype, registered_models
from attnviz.ui.sidebar import current_sentence
from attnviz.viz import qkmap as figures

MAX_TOKENS = 512  # a sentence or a paragraph: one capture's queries and keys

start_page("Queries and keys")
switch_if_asked()
page_intro(
    "Attention compares each query with every key. Here a head's queries (red) and keys (blue) are points of one "
    "picture, moved so that distance means attention: every key shifted by one vector until their centroid meets "
    "the queries' (a query's softmax does not see a shift common to all its keys), and queries and keys scaled to "
    "the same mean length (dot products unchanged). A query then lies near the keys it attends to, as far as a "
    "2D or 3D projection can show it; the share beside each picture says how far."
)


SOURCES = ("The sidebar's sentence", "Documents of the bundled corpus")


def trust_metrics(trusted: dict[int, float]) -> None:
    columns = st.columns(len(trusted))
    for column, (k, share) in zip(columns, trusted.items(), strict=True):
        column.metric(f"strongest key among the {k} nearest" if k > 1 else "strongest key is the nearest",
                      f"{share:.0%}", help="Of the queries: whether the key each attends to most is among its k "
                                           "nearest keys (that it may attend to) in this picture. High: the picture "
                                           "shows where the head looks; low: the projection lost it.")


def selected_query(key: str) -> int | None:
    chosen = st.session_state.get(key)
    points = (chosen.get("selection", {}).get("points", []) if isinstance(chosen, dict)
              else chosen.selection.points if chosen is not None else [])
    for point in points:
        data = point.get("customdata")
        if data and len(data) == 2 and int(data[0]) == 0:
            return int(data[1])
    return None


def choose_from_grid() -> None:
    chosen = st.session_state.get("qk_grid")
    points = (chosen.get("selection", {}).get("points", []) if isinstance(chosen, dict)
              else chosen.selection.points if chosen is not None else [])
    for point in points:
        data = point.get("customdata")
        if data and len(data) == 2:
            st.session_state["qk_layer"], st.session_state["qk_head"] = int(data[0]), int(data[1])
            st.session_state.pop("qk_picture", None)


source = st.segmented_control("Points from", SOURCES, default=SOURCES[0], key="qk_source", required=True,
                              help="One sentence, or many documents at once: each document's queries attend only to "
                                   "its own keys, and every document shares one picture.")
current = capture_current(current_sentence(), max_tokens=MAX_TOKENS)
records = {kind: record for kind, record in current.capture.records.items()}
corpus = None
if source == SOURCES[1]:
    columns = st.columns(2)
    documents = columns[0].slider("Documents", 2, 40, 12, key="qk_documents")
    tokens = columns[1].select_slider("Tokens per document", (32, 64, 128), 64, key="qk_tokens")
    name = current_model_name()
    corpus = corpus_records(registered_models()[name], name, model_dtype(name), documents, tokens, current.bundle)
    records = {kind: record for kind, record in corpus[0].items() if all(kind in one for one in corpus)}
columns = st.columns(3 if len(records) > 1 else 2)  # an attention kind to choose only where there are several
kind = columns[0].selectbox("Attention", list(records), key="qk_kind") if len(records) > 1 else next(iter(records))
record = records[kind]
if queries_unavailable(current.bundle, record, "A picture of queries and keys"):
    st.stop()
layer = columns[-2].selectbox("Layer", range(record.n_layers), key="qk_layer")
if st.session_state.get("qk_head", 0) >= record.n_heads:
    st.session_state["qk_head"] = 0
head = columns[-1].selectbox("Head", range(record.n_heads), key="qk_head")
options = st.columns([3, 2, 4, 2])
method = options[0].segmented_control("Projection", qkmap.PROJECTIONS, default="PCA", key="qk_method",
                                      required=True,
                                      help="PCA: the plane of largest spread, instant and faithful to distances "
                                           "along it; t-SNE and UMAP keep neighbours, seeded, slower.")
dims = 3 if options[1].segmented_control("Dimensions", ("2D", "3D"), default="2D", key="qk_dims",
                                         required=True) == "3D" else 2
colour = options[2].segmented_control("Colour by", figures.COLOURINGS if corpus else figures.COLOURINGS[:2],
                                      default=figures.COLOURINGS[0], key="qk_colour", required=True)
found = options[3].text_input("Find a token", "", key="qk_find", max_chars=40, placeholder="e.g. the",
                              help="Rings every query and key whose token contains this text.")

documents_records = [current.capture.records] if corpus is None else corpus
points_key = current.key if corpus is None else ("corpus", current.key[:3], documents, tokens)
points = cached_points(points_key, kind, layer, head, documents_records)
try:
    with st.spinner(f"{method} of {len(points.queries) + len(points.keys):,} points…"):
        coordinates, trusted = cached_projection(points_key, kind, layer, head, method, dims, 0, points)
except ValueError as problem:
    st.warning(str(problem), icon=":material/info:")
    st.stop()
trust_metrics(trusted)
if not points.translated:
    st.caption(":material/info: This head soft-caps its scores or has a sink: shifting the keys would change its "
               "weights, so they are only scaled.")
query = selected_query("qk_picture")
title = f"{kind} layer {layer}, head {head}: {len(points.queries)} queries and {len(points.keys)} keys ({method})"
show_figure(figures.head_scatter(points, coordinates, title=title, colour=colour, selected_query=query,
                                 found=found),
            "Click a query (red) to draw lines to the three keys it attends to most (thicker: more weight).",
            key="qk_picture", on_select="rerun")
if query is not None and query < len(points.queries):
    document = next(d for d in points.documents if query in d.queries)
    weights = document.weights[query - document.queries.start]
    top = weights.argsort(descending=True)[:3].tolist()
    said = ", ".join(f"“{points.key_tokens[document.keys.start + k]}” ({float(weights[k]):.2f})" for k in top)
    where = "" if corpus is None else f" of document {points.query_documents[query]}"
    st.caption(f"Query {points.query_positions[query]}{where}, “{points.query_tokens[query]}”, attends most to "
               f"{said}.")
    if corpus is not None and kind == "self":
        text = bundled_corpus().documents[points.query_documents[query]].text
        st.button(f"Open document {points.query_documents[query]} in Explore heads on this head",
                  key="qk_open", icon=":material/search:", on_click=ask_to_open,
                  args=(text, current_model_name(), layer, head))

whole = st.toggle("Every layer", key="qk_whole_model",
                  help="Small pictures of every head of the model, not only of this layer (PCA: each at once)")
shown_layers = range(record.n_layers) if whole else [layer]
pictures, labels, cells = [], [], []
for shown in shown_layers:
    for head_index, picture in enumerate(layer_pictures(points_key, kind, shown, documents_records)):
        pictures.append(picture)
        labels.append(f"L{shown} H{head_index}" if whole else f"head {head_index}")
        cells.append((shown, head_index))
where = "every layer" if whole else f"layer {layer}"
show_figure(figures.layer_grid([(p, c) for p, c, _ in pictures], [t[1] for _, _, t in pictures], labels=labels,
                               cells=cells, columns=min(record.n_heads, 12 if whole else 6),
                               title=f"{kind}, {where}: queries and keys of each head (PCA)"),
            "Each head's picture, titled with the share of its queries whose strongest key is their nearest. Click "
            "a head to open it above.", key="qk_grid", on_select=choose_from_grid)
