"""``python -m attnviz.bench explore``: the Explore heads page's computation on the default model, at 32 and 512
tokens: the model run with capture, the replay check, head statistics, and every view built and serialised."""

from __future__ import annotations

import time

from attnviz.system.measure import environment, median_seconds

TOKEN_COUNTS = (32, 512)
NEW_SENTENCE_TARGET_S = 0.5  # a widget change must rerun its page well under half a second


def sentence_of(n_tokens: int, tokenizer) -> str:
    """A natural-looking text whose tokenization (with [CLS]/[SEP]) has exactly ``n_tokens`` tokens."""
    words = ("the quick brown fox jumps over the lazy dog while a small bird sings in the old tree " * 64).split()
    ids = tokenizer(" ".join(words), add_special_tokens=False)["input_ids"][: n_tokens - 2]
    return tokenizer.decode(ids)


def bench_explore(repeats: int) -> dict:
    from attnviz.models.capture import capture
    from attnviz.models.loading import load_model_dir
    from attnviz.models.replay_check import replay_difference
    from attnviz.models.shipped import DEFAULT_MODEL_NAME, default_model_dir
    from attnviz.pagelogic.explore_heads.options import VIEWS, ViewOptions
    from attnviz.pagelogic.explore_heads.statistics import statistics_table
    from attnviz.pagelogic.explore_heads.views import view_figure

    start = time.perf_counter()
    bundle = load_model_dir(default_model_dir(), name=DEFAULT_MODEL_NAME)
    load_seconds = time.perf_counter() - start
    rows = []
    for n_tokens in TOKEN_COUNTS:
        text = sentence_of(n_tokens, bundle.tokenizer)
        result = capture(bundle, text)
        assert len(result.tokens) == n_tokens, (len(result.tokens), n_tokens)
        record = result.records["self"]

        def page_views(result=result):
            # What a rerun of the page does with a cached capture: build the figure and serialise it for the browser.
            sizes = {}
            for view in VIEWS:
                figure, _ = view_figure(result, ViewOptions(view=view, layer=2, head=5))
                sizes[view] = len(figure.to_json())
            return sizes

        def new_sentence(text=text):
            # A new sentence: run the model, replay-check every head, build and serialise the head view.
            fresh = capture(bundle, text)
            replay_difference(fresh.records["self"])
            figure, _ = view_figure(fresh, ViewOptions(view="head"))
            figure.to_json()

        def statistics(result=result):  # computed afresh each time (the page keeps it with the capture)
            result.records["self"].memo.pop("statistics", None)
            return statistics_table(result, "self")

        sizes = page_views()
        rows.append(
            {
                "tokens": n_tokens,
                "capture_s": median_seconds(lambda text=text: capture(bundle, text), repeats),
                "replay_s": median_seconds(lambda record=record: replay_difference(record), repeats),
                "statistics_s": median_seconds(statistics, repeats),
                "rerun_all_views_s": median_seconds(page_views, repeats),
                "new_sentence_s": median_seconds(new_sentence, repeats),
                "figure_bytes": sizes,
            }
        )
    return {"benchmark": "explore", "model": bundle.name, "load_s": load_seconds, "repeats": repeats,
            "environment": environment(), "results": rows}


def print_explore(report: dict) -> list[str]:
    lines = [f"Explore heads on {report['model']} (model load {report['load_s']:.2f} s, "
             f"medians of {report['repeats']})"]
    columns = ("capture_s", "replay_s", "statistics_s", "rerun_all_views_s", "new_sentence_s")
    lines.append(f"{'tokens':>6} {'capture':>10} {'replay':>10} {'stats':>10} {'5 views':>10} {'new text':>10}  "
                 "figure sizes sent (KB)")
    for row in report["results"]:
        sizes = ", ".join(f"{view} {size / 1024:.0f}" for view, size in row["figure_bytes"].items())
        times = " ".join(f"{row[c] * 1000:>8.1f}ms" for c in columns)
        lines.append(f"{row['tokens']:>6} {times}  {sizes}")
    short, long = report["results"]
    verdict = "meets" if short["new_sentence_s"] < NEW_SENTENCE_TARGET_S else "misses"
    lines.append(
        f"32-token warm path (new sentence: model + replay + figure): {short['new_sentence_s']:.3f} s, {verdict} the "
        f"{NEW_SENTENCE_TARGET_S} s target; 512 tokens take {long['new_sentence_s'] / short['new_sentence_s']:.1f}x "
        "as long."
    )
    return lines
