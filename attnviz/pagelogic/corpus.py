"""What the "Heads across a corpus" page computes beside the scan's own readings: a running scan's progress in
words, the custom offsets typed, the notes under the maps, an example's line, and what two compared scans read
differently. No Streamlit, no database: the page reads the scan and passes what it read."""

from __future__ import annotations

import numpy as np

MOST_OFFSET = 32  # the scan keeps the weight at each relative position within ±32


# The row statistics' names, as the Heads across a corpus page words them (and Over training for a series' scans).
STATISTIC_NAMES = {
    "previous": "weight on the previous token", "next": "weight on the next token", "self": "weight on itself",
    "first": "weight on the first token", "separator": "weight on separators ([SEP], </s>, <|endoftext|>)",
    "special": "weight on special tokens ([UNK] not counted)", "punctuation": "weight on punctuation",
    "duplicate": "duplicate token: weight on earlier copies of the query's token",
    "induction": "induction: weight on the token after an earlier copy of the query's token",
    "max_weight": "largest weight of a query", "normalised_entropy": "normalised entropy (1 = uniform)",
    "entropy": "entropy (nats)", "mean_distance": "mean distance (tokens)",
}


def scan_progress(said: dict, seconds: float) -> tuple[float, str]:
    """A running scan's progress bar, ``(share done, words)``, from its progress record ``said`` ({} before the
    first) and the ``seconds`` since it started."""
    done, planned = int(said.get("done", 0)), int(said.get("planned", 0) or 1)
    rate, eta = said.get("documents_per_second") or 0.0, said.get("eta")
    left = "" if eta is None else f" · about {int(eta) // 60} min {int(eta) % 60:02d} s left"
    sampled, sample_planned = int(said.get("sampled", 0)), int(said.get("sample_planned", 0))
    if sample_planned:  # every document read: the queries and keys of the sample are being kept
        return (min(1.0, sampled / sample_planned),
                f"Keeping the queries, keys and values of {sample_planned:,} sampled documents for the Queries and "
                f"keys page: {sampled:,} done")
    return (min(1.0, done / planned),
            f"Scanning: {done:,} of {planned:,} documents · {rate:.1f} documents/s · "
            f"{said.get('tokens_per_second', 0):,.0f} tokens/s{left}"
            if said else f"Starting the scan (loading the model, reading the corpus): {seconds:.0f} s")


def scan_label(said: dict) -> str:
    """A scan in the page's list: model, corpus, documents and the token limit (two scans of one model differ
    there)."""
    return (f"{said.get('model')} · {said.get('corpus')} · {said.get('documents_scanned', 0):,} documents · "
            f"≤ {said.get('max_tokens')} tokens")


def typed_offsets(typed: str) -> tuple[list[int], str | None]:
    """The relative positions a custom detector looks at, typed as "-2" or "-3, -2": (the offsets, sorted, once
    each; None) or ([], what is wrong with the text)."""
    try:
        offsets = sorted({int(part) for part in typed.replace(";", ",").split(",") if part.strip()})
    except ValueError:
        return [], "Type whole numbers separated by commas, such as -3, -2."
    outside = [o for o in offsets if abs(o) > MOST_OFFSET]
    if outside or not offsets:
        return [], ("Offsets go from −32 to 32 (the scan keeps the weight at each offset within that range)."
                    if outside else "Type at least one offset.")
    return offsets, None


def highest_note(mean: np.ndarray) -> str:
    """Which head has the highest value of a ``[layers, heads]`` map (NaN: no value)."""
    if np.isfinite(mean).any():
        best = np.unravel_index(np.nanargmax(mean), mean.shape)
        return f"Highest: layer {best[0]}, head {best[1]} ({mean[best]:.3g})."
    return "No head has this statistic in this scan."


def example_line(rank: int, example: dict) -> str:
    """An example's line above its text: its rank, score, document, query, key and weight, and whether the key is
    the end token the tokenizer added to a cut document."""
    query, key = example["query"], example["key"]
    cut_end = (f" · the key is the end token the tokenizer adds to a document cut at {example['n_tokens']} tokens"
               if example["truncated"] and key == example["n_tokens"] - 1 else "")
    return (f"**{rank + 1}.** score {example['score']:.3f} · document {example['doc']} ({example['source']}) · "
            f"query {query} → key {key} (weight {example['weight']:.3f}){cut_end}")


def example_positions(example: dict) -> list[int]:
    """The document positions of an example's window (one run from its start where the scan kept no positions)."""
    kept = example.get("window_positions")
    if kept is not None and len(kept):
        return [int(p) for p in kept]
    return list(range(example["window_start"], example["window_start"] + len(example["window_tokens"])))


def compared_names(said: dict, other_said: dict) -> tuple[str, str]:
    """The two scans' names in a comparison: their models, or, for one model twice, its limits too."""
    names = (said["model"], other_said["model"])
    if names[0] == names[1]:  # one model twice: the scans are told apart by their limits
        names = tuple(f"{s['model']} ({s['documents_scanned']:,} documents, ≤ {s['max_tokens']} tokens)"
                      for s in (said, other_said))
    return names


def largest_change(difference: np.ndarray) -> str:
    """Which head changes most between two scans' ``[layers, heads]`` maps."""
    if np.isfinite(difference).any():
        layer, head = np.unravel_index(np.nanargmax(np.abs(difference)), difference.shape)
        return f"Largest change: layer {layer}, head {head} ({difference[layer, head]:+.3g})."
    return "No head has this statistic in both scans."


def read_differently(said: dict, other_said: dict) -> list[str]:
    """What two scans read differently (the corpus, how many documents, how many tokens of each), in words."""
    return [what for what, differs in (
        ("different corpora", other_said.get("corpus_fingerprint") != said.get("corpus_fingerprint")),
        (f"{said['documents_scanned']:,} and {other_said['documents_scanned']:,} documents",
         said["documents_scanned"] != other_said["documents_scanned"]),
        (f"at most {said.get('max_tokens')} and {other_said.get('max_tokens')} tokens a document",
         said.get("max_tokens") != other_said.get("max_tokens"))) if differs]
