"""The "Queries and keys" page's computations, process-wide, keyed by what names the captures they come from (one
sentence's, or the documents') and the head: a head's normalised points, their projections and trust. Captures
are given as a list of documents, each its records by attention kind."""

from __future__ import annotations

import streamlit as st

from attnviz.pagelogic import qkmap


@st.cache_resource(max_entries=64, show_spinner=False)
def cached_points(points_key: tuple, kind: str, layer: int, head: int, _documents: list) -> qkmap.HeadPoints:
    return qkmap.head_points([records[kind] for records in _documents], layer, head)


@st.cache_resource(max_entries=64, show_spinner=False)
def cached_projection(points_key: tuple, kind: str, layer: int, head: int, method: str, dims: int, seed: int,
                      _points: qkmap.HeadPoints):
    coordinates = qkmap.project(_points, method, dims, seed=seed)
    return coordinates, qkmap.trust(_points, coordinates)


def layer_pictures(points_key: tuple, kind: str, layer: int, documents: list) -> list[tuple]:
    """Every head of a layer: its points, its PCA picture and the share of its queries whose strongest key is
    their nearest (PCA: instant)."""
    pictures = []
    for head in range(documents[0][kind].n_heads):
        points = cached_points(points_key, kind, layer, head, documents)
        coordinates, trusted = cached_projection(points_key, kind, layer, head, "PCA", 2, 0, points)
        pictures.append((points, coordinates, trusted))
    return pictures


@st.cache_resource(max_entries=4, show_spinner="Running the model on each document…")
def corpus_records(folder: str, name: str, dtype: str, documents: int, max_tokens: int, _bundle) -> list:
    """The model's captures of the bundled corpus's first ``documents`` documents (each up to ``max_tokens``): one
    record per document, by attention kind."""
    from attnviz.models.capture import capture
    from attnviz.scan.corpus import bundled_corpus

    return [capture(_bundle, document.text, max_tokens=max_tokens).records
            for document in bundled_corpus().documents[:documents]]

