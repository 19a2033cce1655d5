"""The README and the pages under docs/ hold together: every relative link and picture points to a file of the
checkout, and the README's first screen says how to start (the app, the tests, the package, the notebook API and
the `attnviz` command)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

APP_COMMAND = "pip install -r requirements.txt && streamlit run app.py"
TEST_COMMAND = "pip install -r requirements-dev.txt && ruff check && python -m pytest"  # what .ci/run runs

FENCED_CODE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target) and ![alt](target), with one level of brackets inside the text and an optional "title"
MARKDOWN_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"<(?:img|a|source)\b[^>]*?\b(?:src|href|srcset)\s*=\s*[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def links(path: Path) -> list[str]:
    """The link and picture targets of a Markdown file, outside code (a link in a code block is an example)."""
    text = INLINE_CODE.sub("", FENCED_CODE.sub("", path.read_text(encoding="utf-8")))
    return MARKDOWN_LINK.findall(text) + HTML_LINK.findall(text)


def local_file(target: str) -> str | None:
    """The file part of a relative link (no anchor, no query), or None for an absolute URL or an anchor alone."""
    if SCHEME.match(target) or target.startswith("//"):
        return None
    file_part = target.split("#", 1)[0].split("?", 1)[0]
    return file_part or None


def test_the_link_finder_sees_links_and_pictures_but_not_code():
    text = ("[a](docs/a.md#x) ![b **c** [d]](pics/b.png \"t\") [w](https://example.org) [in](#anchor)\n"
            "`[no](inline.md)`\n```\n[no](fenced.md)\n```\n<img src=\"docs/c.png\" width=300>\n")
    found = MARKDOWN_LINK.findall(INLINE_CODE.sub("", FENCED_CODE.sub("", text))) + HTML_LINK.findall(text)
    assert found == ["docs/a.md#x", "pics/b.png", "https://example.org", "#anchor", "docs/c.png"]
    assert [local_file(t) for t in found] == ["docs/a.md", "pics/b.png", None, None, "docs/c.png"]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_picture_points_to_a_file(document: Path):
    targets = links(document)
    assert targets or document.name != "README.md", "the README links to its docs"
    missing = []
    for target in targets:
        file_part = local_file(target)
        if file_part is None:
            continue
        resolved = (ROOT / file_part.lstrip("/")) if file_part.startswith("/") else (document.parent / file_part)
        if not resolved.exists():
            missing.append(target)
    assert not missing, f"{document.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_the_readme_s_first_screen_says_how_to_start():
    first_screen = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:60])
    for words in (APP_COMMAND, TEST_COMMAND, "pip install", "import attnviz", "attnviz serve"):
        assert words in first_screen, f"{words!r} is not in the README's first 60 lines"


def test_the_readme_s_test_command_is_the_one_ci_runs():
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_document_points_outside_the_checkout(document: Path):
    assert "../shared/" not in document.read_text(encoding="utf-8")
