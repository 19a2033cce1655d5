"""attnviz.core.units: how numbers are written for people."""

import re
from pathlib import Path

import pytest

from attnviz.core.units import ordinal

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("n", "written"), [
    (1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"), (13, "13th"), (21, "21st"),
    (22, "22nd"), (23, "23rd"), (101, "101st"), (111, "111th"), (112, "112th"), (10, "10th"), (20, "20th"),
    (100, "100th"), (113, "113th"), (121, "121st"), (1001, "1,001st"), (1011, "1,011th"),
])
def test_ordinals_as_english_writes_them(n, written):
    assert ordinal(n) == written


def test_no_page_writes_an_ordinal_suffix_by_hand():
    """A suffix glued to a computed number in an f-string ("{k + 1}th") says "21th", "22th", "23th": every place
    that writes an ordinal goes through :func:`attnviz.core.units.ordinal`."""
    glued = re.compile(r"\}(st|nd|rd|th)\b")
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in sorted((ROOT / "attnviz").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if glued.search(line)]
    found += [f"app.py:{number}" for number, line in enumerate((ROOT / "app.py").read_text().splitlines(), 1)
              if glued.search(line)]
    assert not found, found


def test_one_function_writes_ordinals():
    """Ordinal suffixes are chosen in one place (:func:`attnviz.core.units.ordinal`), not again per module."""
    table = re.compile(r"""\{\s*1\s*:\s*["']st["']""")
    files = sorted((ROOT / "attnviz").rglob("*.py"))
    found = [str(path.relative_to(ROOT)) for path in files
             if table.search(path.read_text()) and path != ROOT / "attnviz" / "core" / "units.py"]
    assert not found, found
