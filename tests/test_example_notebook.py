"""The example notebook (examples/induction_heads.ipynb) runs top to bottom under a real Jupyter kernel
(nbclient + ipykernel), as a researcher runs it, and shows its figures offline."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "induction_heads.ipynb"

pytestmark = pytest.mark.slow


def test_the_committed_notebook_holds_no_outputs():
    """Outputs are made by running it (the first figure alone carries 4.8 MB of plotly.js)."""
    import nbformat

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


def test_the_example_notebook_runs_and_finds_the_induction_heads(tmp_path, monkeypatch):
    import nbclient
    import nbformat

    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the kernel imports this checkout (the installed path: test_installed)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the cell, on any error

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    printed = "".join(output.text for output in outputs if output.output_type == "stream")
    agreed = re.search(r"found by all three: (\[.*\])", printed)
    assert agreed and agreed.group(1) != "[]", printed  # the notebook asserts its own in-memory check too
    assert (tmp_path / "induction-scan.duckdb").is_file()  # the scan writes where the notebook runs

    figures = [output.data for output in outputs if "application/vnd.plotly.v1+json" in output.get("data", {})]
    assert len(figures) == 4  # the grid, the importance map, the paths, the attribution
    for data in figures:  # offline: the HTML carries its plotly.js or uses the one already sent, never a network one
        assert "text/html" in data and not re.search(r"<script[^>]+src=[\"']?https?:", data["text/html"])
    assert len(figures[0]["text/html"]) > 1_000_000 > max(len(data["text/html"]) for data in figures[1:])  # once
    through = re.search(r"with the MLPs free: +([-0-9.]+)", printed)
    assert through and float(through.group(1)) > 0.1, printed  # the path into the induction head's keys is traced
