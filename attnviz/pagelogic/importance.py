"""What the "Does this head matter?" page computes beside the interventions themselves: the measures' names and
captions, the tables of agreement, the counts above a map, a corpus run's maps and rows read back, its progress in
words, the head labels of a capture, and the induction circuit's table. No Streamlit: the page draws these."""

from __future__ import annotations

import torch

from attnviz.interventions import importance as imp
from attnviz.interventions import importance_ranks as ranking
from attnviz.interventions import induction_circuit as ind
from attnviz.pagelogic.explore_heads.statistics import statistics_table

MEASURES = {"next-token": "loss change (nats)", "seq2seq": "loss change (nats)", "masked": "loss change (nats)",
            "hidden": "hidden-state change"}
METHOD_TITLES = {"zero": "Zero ablation", "mean": "Mean ablation", "gradient": "Gradient importance"}
SHOWN_STATISTICS = ("previous token", "first token", "self", "normalised entropy", "mean distance")


def texts_of(box: str) -> list[str]:
    """The texts of a box, one a line (blank lines left out)."""
    return [line.strip() for line in box.splitlines() if line.strip()]


def map_caption(method: str, objective: str, over: str = "texts") -> str:
    """What to notice in one measure's heatmap."""
    return (f"How fast the loss moves as the head's gate leaves 1 (averaged over {over})."
            if method == "gradient" else "How far the final states move without the head."
            if objective == "hidden" else "Red: the loss rises without the head (it helps); blue: it falls.")


def agreement_rows(maps: dict[str, imp.ImportanceMap]) -> list[dict]:
    """Spearman's rho between each two measures' maps, a row each."""
    return [{"first": METHOD_TITLES[a], "second": METHOD_TITLES[b], "Spearman's rho": round(rho, 3)}
            for a, b, rho in ranking.agreement(maps)]


def disagreement_rows(maps: dict[str, imp.ImportanceMap]) -> tuple[str, list[dict]]:
    """(the measure compared with zero ablation: gradient importance where there is one, the heads where they
    disagree most, with their ranks by each)."""
    second = "gradient" if "gradient" in maps else list(maps)[-1]
    rows = ranking.disagreements(maps["zero"], maps[second])
    names = {"zero": "rank by zero ablation", second: f"rank by {METHOD_TITLES[second].lower()}"}
    return second, [{names.get(column, column): value for column, value in row.items()} for row in rows]


def study_counts(result: imp.Study, objective: str) -> tuple[int, int, int]:
    """(texts with something to predict, tokens read, texts cut) of a study."""
    tokens = int(result.batch.real[: len(result.batch.texts)].sum())  # a text's copies are one text
    cut = sum(result.batch.cut)
    predicting = sum(len(text_tokens) > 1 for text_tokens in result.batch.tokens) if objective == "next-token" else \
        len(result.batch.texts)  # a one-token text has no next token: it adds nothing to the loss or the maps
    return predicting, tokens, cut


def add_head_labels(capture, labels: dict, statistics: dict) -> None:
    """Explore heads' label and statistics of each self-attention head of a capture, added to ``labels`` and
    ``statistics`` by (kind, layer, head), head by head (those added before a problem are kept)."""
    for kind, record in capture.records.items():
        if record.n_q == record.n_k:  # labels describe self-attention
            table = statistics_table(capture, kind)
            for _, found in table.iterrows():
                cell = (kind, int(found["layer"]), int(found["head"]))
                labels[cell] = found["label"]
                statistics[cell] = {column: round(float(found[column]), 3) for column in SHOWN_STATISTICS}


def run_progress(said: dict, seconds: float) -> tuple[float, str]:
    """A corpus run's progress bar, ``(share done, words)``, from its progress record ``said`` ({} before the
    first) and the ``seconds`` since it started."""
    done, planned = int(said.get("done", 0)), int(said.get("planned", 0) or 1)
    if not said:
        text = f"Starting (loading the model, reading the corpus): {seconds:.0f} s"
    elif said.get("phase") == "means":
        text = "First pass: each head's mean output over the corpus (for mean ablation)…"
    else:
        rate, eta = said.get("documents_per_second") or 0.0, said.get("eta")
        left = "" if eta is None else f" · about {int(eta) // 60} min {int(eta) % 60:02d} s left"
        text = f"Removing each head: {done:,} of {planned:,} documents · {rate:.2f} documents/s{left}"
    return min(1.0, done / planned), text


def run_maps(results: dict, objective: str) -> dict[str, imp.ImportanceMap]:
    """A corpus run's mean maps, one per measure, from what its database holds (``results``)."""
    return {method: imp.ImportanceMap(method, torch.tensor(mean), results["modules"], objective, results["clean"])
            for method, (mean, _, _) in results["maps"].items()}


def run_rows(results: dict, maps: dict[str, imp.ImportanceMap], objective: str,
             labels_of_scan: dict | None) -> list[dict]:
    """Every head of a corpus run, with its spread over the documents by each measure and, where the documents were
    a scan's read with its model (``labels_of_scan``: (layer, head) -> (label, share)), the scan's label."""
    modules = results["modules"]
    cells = {f"{module.label}, head {head}": (row, head)
             for row, module in enumerate(modules) for head in range(module.heads)}
    rows = ranking.head_rows(imp.Study(None, objective, modules, maps))
    for entry in rows:
        row, head = cells[entry["head"]]
        for method in maps:
            entry[f"spread ({method})"] = float(results["maps"][method][1][row, head])
        entry.pop("label", None)
        if labels_of_scan is not None:
            found = labels_of_scan.get((modules[row].index, head)) if modules[row].kind in ("self", "encoder") else None
            entry["label over the scan"] = f"{found[0]} ({found[1]:.0%} of documents)" if found else ""
    return rows


def copy_losses(result) -> tuple[list[float], list[float]]:
    """The loss on the first and on the second copy with each head removed, head by head."""
    return ([float(v) for row in result.first for v in row if v == v],
            [float(v) for row in result.second for v in row if v == v])


def circuit_table(result, scores: dict, composed, labels: list[str]) -> tuple[list[dict], dict[str, str]]:
    """The induction circuit's table: each head's scores and the loss on each copy without it, and each column's
    meaning; with the induction scores with the feeding previous-token head zeroed when there is one."""
    first, second = copy_losses(result)
    induction = scores["induction"].flatten().tolist()
    previous = scores["previous"].flatten().tolist()
    rows = [{"head": label, "previous": round(p, 3), "induction": round(i, 3),
             "copy 1 ×": round(f / result.clean_first, 3), "copy 2 ×": round(s / result.clean_second, 2)}
            for label, p, i, f, s in zip(labels, previous, induction, first, second, strict=True)]
    helps = {"previous": "previous-token score", "induction": "induction score",
             "copy 1 ×": "loss on the first copy with the head removed, divided by the clean loss",
             "copy 2 ×": "loss on the second copy with the head removed, divided by the clean loss"}
    if composed is not None:  # where each head looks with the previous-token head that may feed them zeroed
        feeder = labels[ind.feeder(result, scores)]
        column = f"induction, {feeder} off"
        helps[column] = f"induction score with {feeder} (the previous-token head that may feed it) zeroed"
        for row, value in zip(rows, composed.flatten().tolist(), strict=True):
            row[column] = round(value, 3)
    return rows, helps
