"""Everything the "Explore heads" page computes, as functions of a :class:`~attnviz.models.record.Capture`; one
module per tab, so each reads in one sitting. The page only reads widgets, calls these, and draws the figures they
return; the benchmarks call the same.

- :mod:`.options`: what the page is set to (``ViewOptions``) and the token filters every tab applies
- :mod:`.matrices`: the weights matrix a heatmap draws: streamed, pooled, zoomed, scaled and titled
- :mod:`.views`, :mod:`.grid`: the View tab (``VIEW_BUILDERS``: one builder per view)
- :mod:`.statistics`: the Head statistics tab
- :mod:`.qk`: the Q·K tab; :mod:`.compare`: two texts; :mod:`.whatif`: another mask, scale or temperature
- :mod:`.export`, :mod:`.bertviz_view`: downloads and bertviz; :mod:`.long_texts`: long texts offline

The names below are re-exported for the tests, the benchmarks and the caches; new code imports from the modules.
"""

from attnviz.pagelogic.explore_heads.bertviz_view import bertviz_html
from attnviz.pagelogic.explore_heads.compare import compare_figures
from attnviz.pagelogic.explore_heads.export import capture_npz, figure_html, matrix_csv, matrix_json, shown_matrix
from attnviz.pagelogic.explore_heads.grid import (
    BADGES,
    GRID_NOTES_LIMIT,
    THUMBNAIL,
    filtered_thumbnails,
    grid_notes,
    grid_thumbnails,
    has_thumbnails,
)
from attnviz.pagelogic.explore_heads.long_texts import sample_text
from attnviz.pagelogic.explore_heads.matrices import (
    POOL_LIMIT,
    ZOOM_SIZES,
    Matrix,
    dense_matrix,
    head_matrix,
    matrix_title,
    pooled_title,
    weights_heatmap,
    with_segments,
    zoom_matrix,
)
from attnviz.pagelogic.explore_heads.options import (
    BLOCKS,
    GRID_SCALES,
    KIND_NAMES,
    SCALES,
    VIEWS,
    Filtered,
    ViewOptions,
    filter_note,
    filtered,
    positions,
)
from attnviz.pagelogic.explore_heads.qk import QueryKey, query_key, query_key_figures
from attnviz.pagelogic.explore_heads.statistics import (
    MAPPABLE_STATISTICS,
    has_statistics,
    label_rules_text,
    statistic_figure,
    statistics_column_config,
    statistics_table,
)
from attnviz.pagelogic.explore_heads.views import LINES_TOKEN_LIMIT, VIEW_BUILDERS, view_figure, zoom_figure
from attnviz.pagelogic.explore_heads.whatif import (
    MODEL_OWN_MASK,
    WhatIfEffect,
    what_if,
    what_if_caption,
    what_if_effect,
    what_if_mask,
    what_if_mask_label,
    what_if_masks,
)

__all__ = [
    "BADGES", "BLOCKS", "GRID_NOTES_LIMIT", "GRID_SCALES", "KIND_NAMES", "LINES_TOKEN_LIMIT", "MAPPABLE_STATISTICS",
    "MODEL_OWN_MASK", "POOL_LIMIT", "SCALES", "THUMBNAIL", "VIEWS", "VIEW_BUILDERS", "ZOOM_SIZES", "Filtered",
    "Matrix", "QueryKey", "ViewOptions", "WhatIfEffect", "bertviz_html", "capture_npz", "compare_figures",
    "dense_matrix", "figure_html", "filter_note", "filtered", "filtered_thumbnails", "grid_notes", "grid_thumbnails",
    "has_statistics", "has_thumbnails", "head_matrix", "label_rules_text", "matrix_csv", "matrix_json",
    "matrix_title", "pooled_title", "positions", "query_key", "query_key_figures", "sample_text", "shown_matrix",
    "statistic_figure", "statistics_column_config", "statistics_table", "view_figure", "weights_heatmap", "what_if",
    "what_if_caption", "what_if_effect", "what_if_mask", "what_if_mask_label", "what_if_masks", "with_segments",
    "zoom_figure", "zoom_matrix",
]
