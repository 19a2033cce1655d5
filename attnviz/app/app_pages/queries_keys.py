"""Queries and keys in one picture: a head's query and key vectors as points of one space, where a query lies near
the keys it attends to (AttentionViz, Yeh et al. 2023), on any checkpoint attnviz reads."""

from functools import partial
from pathlib import Path

import streamlit as st

from attnviz.corpus.documents import bundled_corpus
from attnviz.pagelogic import queries_keys
from attnviz.pagelogic.clicks import clicked_layer_head
from attnviz.ui import scans
from attnviz.ui.caches.queries_keys import (
    cached_points,
    cached_projection,
    corpus_captures,
    grid_figure,
    projections_file,
    sampled_scans,
    scan_grid,
    scan_points,
    scan_projection,
)
from attnviz.ui.captures import capture_current
from attnviz.ui.figures import show_figure
from attnviz.ui.frame import page_intro, start_page
from attnviz.ui.messages import queries_unavailable
from attnviz.ui.open_in_explore import ask_to_open, switch_if_asked
from attnviz.ui.session_models import current_model_name, model_dtype, registered_models
from attnviz.ui.sidebar import current_sentence
from attnviz.viz import queries_keys as figures

MAX_TOKENS = 512  # a sentence or a paragraph: one capture's queries and keys

SOURCES = ("The sidebar's sentence", "Documents of the bundled corpus", "A scan's sample")


def trust_metrics(trusted: dict[int, float], counted: dict[int, int], n_queries: int) -> None:
    columns = st.columns(len(trusted))
    for column, (k, share) in zip(columns, trusted.items(), strict=True):
        keys = f"more than {k} keys" if k > 1 else "more than one key"
        column.metric(f"strongest key among the {k} nearest" if k > 1 else "strongest key is the nearest",
                      "–" if share != share else f"{share:.0%}",  # NaN: no query had more keys than k
                      help=f"Of the {counted[k]:,} queries that may attend to {keys}: whether the key each "
                           f"attends to most is among its {k} nearest keys (that it may attend to) in this picture. "
                           "High: the picture shows where the head looks; low: the projection lost it.")
    st.caption(queries_keys.trust_statement(counted, n_queries))


def choose_from_grid(n_layers: int, n_heads: int) -> None:
    """The grid's click (run before the page): the clicked head becomes the one drawn above, with no query chosen."""
    clicked = clicked_layer_head(st.session_state.get("qk_grid"), n_layers, n_heads)
    if clicked is not None:
        st.session_state["qk_layer"], st.session_state["qk_head"] = clicked
        st.session_state.pop("qk_picture", None)


def points_source(current, name: str) -> tuple[list, dict | None, tuple]:
    """Where the points come from: (the captures, the scan or None, what names the points)."""
    source = st.segmented_control("Points from", SOURCES, default=SOURCES[0], key="qk_source", required=True,
                                  help="One sentence; many documents at once (each document's queries attend only "
                                       "to its own keys, and every document shares one picture); or the documents a "
                                       "scan of Heads across a corpus drew evenly across its corpus and kept.")
    captures, scan = [current.capture], None
    points_key: tuple = current.key
    if source == SOURCES[1]:
        columns = st.columns(2)
        documents = columns[0].slider("Documents", 2, 40, 12, key="qk_documents")
        tokens = columns[1].select_slider("Tokens per document", (32, 64, 128), 64, key="qk_tokens")
        captures = corpus_captures(registered_models()[name], name, model_dtype(name), documents, tokens,
                                   current.bundle)
        points_key = ("corpus", current.key[:3], documents, tokens)
    elif source == SOURCES[2]:
        scans_made = sampled_scans(str(current.bundle.folder))
        if not scans_made:
            st.info(f"No finished scan of {name} has kept queries and keys yet. Scan a corpus on the Heads across a "
                    "corpus page: it keeps every head's queries, keys and values of whole documents drawn evenly "
                    "across the corpus (2,048 tokens a head by default).", icon=":material/info:")
            st.stop()
        labels = {str(path): f"{said['corpus']} · {said['documents']:,} documents, {said['tokens']:,} tokens drawn "
                             f"from {said['documents_scanned']:,} scanned · {Path(path).stem[:8]}"
                  for path, said in scans_made}
        chosen = st.selectbox("Scan", list(labels), format_func=labels.get, key="qk_scan")
        scan = dict(scans_made)[Path(chosen)] | {"path": chosen}
        points_key = ("scan", chosen, scan["key"])
    return captures, scan, points_key


def attention_kind(current, captures: list, scan: dict | None) -> tuple[str, int, int]:
    """The attention kind (a choice only where there are several), its layers and heads; the chosen layer and head
    kept within them."""
    if scan is None:
        records = {kind: record for kind, record in captures[0].records.items()
                   if all(kind in capture.records for capture in captures)}
        kinds = list(records)
        n_layers_of = {kind: (record.n_layers, record.n_heads) for kind, record in records.items()}
    else:
        kinds = [scan["kind"]]
        n_layers_of = {scan["kind"]: (scan["n_layers"], scan["n_heads"])}
    # an attention kind to choose only where there are several
    kind = st.selectbox("Attention", kinds, key="qk_kind") if len(kinds) > 1 else kinds[0]
    if scan is None and queries_unavailable(current.bundle, records[kind], "A picture of queries and keys"):
        st.stop()
    n_layers, n_heads = n_layers_of[kind]
    if st.session_state.get("qk_layer", 0) >= n_layers:
        st.session_state["qk_layer"] = 0
    if st.session_state.get("qk_head", 0) >= n_heads:
        st.session_state["qk_head"] = 0
    return kind, n_layers, n_heads


def picture_controls(n_layers: int, n_heads: int, several: bool) -> tuple:
    """(layer, head, projection, dimensions, values too, colouring, token to find)."""
    # Two rows of controls, so the picture sits on a projector's first screen, and each fits a 900 px window
    options = st.columns([1, 1, 2, 2])
    layer = options[0].selectbox("Layer", range(n_layers), key="qk_layer")
    head = options[1].selectbox("Head", range(n_heads), key="qk_head")
    method = options[2].segmented_control("Projection", queries_keys.PROJECTIONS, default="PCA", key="qk_method",
                                          required=True,
                                          help="PCA: the plane of largest spread, instant and faithful to distances "
                                               "along it; t-SNE and UMAP keep neighbours, seeded, slower.")
    dims = 3 if options[3].segmented_control("Dimensions", ("2D", "3D"), default="2D", key="qk_dims",
                                             required=True) == "3D" else 2
    options = st.columns([3, 1, 1])
    values = options[1].toggle("Values too", key="qk_values",
                               help="The head's value vectors as a third set (green triangles). Values are never "
                                    "compared with queries: they sit around the keys' centre with the keys' spread, "
                                    "so only their own clusters mean something (tokens the head passes on alike).")
    colour = options[0].segmented_control("Colour by", figures.COLOURINGS if several else figures.COLOURINGS[:3],
                                          default=figures.COLOURINGS[0], key="qk_colour", required=True)
    found = options[2].text_input("Find a token", "", key="qk_find", max_chars=40, placeholder="e.g. the",
                                  help="Rings every query and key whose token contains this text.")
    return layer, head, method, dims, values, colour, found


def projected(points_key: tuple, kind: str, layer: int, head: int, method: str, dims: int, values: bool,
              captures: list, scan: dict | None) -> tuple:
    """(the head's points, their coordinates, trust, values shown): a problem with them said, and the page stopped."""
    try:
        if scan is None:
            points = cached_points(points_key, kind, layer, head, values, captures)
        else:
            points = scan_points(scan["path"], scan["key"], layer, head, values)
        if values and points.values is None:
            st.info("This model's attention does not give its value vectors here: queries and keys only.",
                    icon=":material/info:")
            values = False
        first_umap = " (the server's first UMAP compiles its code: about half a minute)" if method == "UMAP" else ""
        with st.spinner(f"{method} of {len(points.queries) + len(points.keys) * (2 if values else 1):,} points…"
                        f"{first_umap}"):
            if scan is None:
                coordinates, trusted = cached_projection(points_key, kind, layer, head, method, dims, 0, values,
                                                         points)
            else:
                coordinates, trusted = scan_projection(scan["path"], scan["key"], layer, head, method, dims, 0,
                                                       values, points,
                                                       _kept=projections_file(scan["path"], scan["key"]))
    except ValueError as problem:
        st.warning(str(problem), icon=":material/info:")
        st.stop()
    return points, coordinates, trusted, values


def clicked_query_note(points, query: int, kind: str, layer: int, head: int, several: bool, scan: dict | None,
                       name: str) -> None:
    """The clicked query's strongest keys, and its document opened in Explore heads."""
    index, document = points.document_of_query(query)
    local = query - document.queries.start
    said = ", ".join(f"“{points.key_tokens[document.keys.start + int(k)]}” ({float(w):.2f})"
                     for k, w in zip(document.strongest_keys[local], document.strongest_weights[local], strict=True)
                     if w > 0)
    doc = points.document_name(index)
    where = "" if not several else f" of document {doc}"
    st.caption(f"Query {points.query_positions[query]}{where}, “{points.query_tokens[query]}”, attends most to "
               f"{said}.")
    if several and kind in ("self", "encoder"):
        text = (bundled_corpus().documents[doc].text if scan is None
                else (scans.document(scan["path"], doc) or {}).get("text"))
        if text:
            st.button(f"Open document {doc} in Explore heads on this head", key="qk_open", icon=":material/search:",
                      on_click=ask_to_open, args=(text, name, layer, head))


def grid_section(points_key: tuple, kind: str, layer: int, n_layers: int, n_heads: int, captures: list,
                 scan: dict | None) -> None:
    whole = st.toggle("Every layer", key="qk_whole_model",
                      help="Small pictures of every head of the model, not only of this layer (PCA: each at once)")
    shown_layers = tuple(range(n_layers)) if whole else (layer,)
    kept = scan_grid(scan["path"], scan["key"]) if scan is not None else None
    show_figure(grid_figure(points_key, kind, shown_layers, n_heads, whole, _captures=captures, _kept=kept),
                "Each head's picture, titled with the share of its queries (of those that may attend to more than "
                "one key) whose strongest key is their nearest. Click a head to open it above.", key="qk_grid",
                on_select=partial(choose_from_grid, n_layers, n_heads))


def main() -> None:
    start_page("Queries and keys")
    switch_if_asked()
    page_intro(
        "Attention compares each query with every key. Here a head's queries (circles) and keys (diamonds) are points "
        "of one picture, moved so that distance means attention: every key shifted by one vector until their centroid "
        "meets the queries' (a query's softmax does not see a shift common to all its keys), and queries and keys "
        "scaled to the same mean length (dot products unchanged). A query then lies near the keys it attends to, as "
        "far as a 2D or 3D projection can show it; the share beside each picture says how far."
    )
    current = capture_current(current_sentence(), max_tokens=MAX_TOKENS)
    name = current_model_name()
    captures, scan, points_key = points_source(current, name)
    kind, n_layers, n_heads = attention_kind(current, captures, scan)
    several = scan is not None or len(captures) > 1
    layer, head, method, dims, values, colour, found = picture_controls(n_layers, n_heads, several)
    points, coordinates, trusted, values = projected(points_key, kind, layer, head, method, dims, values, captures,
                                                     scan)
    if not points.translated:
        st.caption(":material/info: This head soft-caps its scores or has a sink: shifting the keys would change its "
                   "weights, so they are only scaled.")
    if scan is not None:
        st.caption(f":material/database: {len(points.documents)} documents drawn evenly across the {scan['corpus']} "
                   f"corpus and kept by the scan (float16 vectors; each query's strongest keys are the model's own). "
                   "Projections are kept in the scan's database once made.")
    query = queries_keys.clicked_query(st.session_state.get("qk_picture"), len(points.queries))
    shown_sets = f"{len(points.queries)} queries, {len(points.keys)} keys and values" if values else \
        f"{len(points.queries)} queries and {len(points.keys)} keys"
    title = f"{kind} layer {layer}, head {head}: {shown_sets} ({method})"
    show_figure(figures.head_scatter(points, coordinates, title=title, colour=colour, selected_query=query,
                                     found=found),
                figures.head_caption(colour, dims), key="qk_picture", on_select="rerun")
    if query is not None:  # clicked_query keeps to this picture's queries
        clicked_query_note(points, query, kind, layer, head, several, scan, name)
    # how far to trust the picture: under it, so the picture is on the first screen
    trust_metrics(trusted, queries_keys.trust_counted(points), len(points.queries))
    grid_section(points_key, kind, layer, n_layers, n_heads, captures, scan)


main()
