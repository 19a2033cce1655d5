"""English that ships with every Python: its documentation (``pydoc_data.topics``) and the standard library's
docstrings. The bundled tiny GPT is trained and measured on it (split into the part it trains on and the held-out
end it never sees), and it is the bundled corpus of a scan (:mod:`attnviz.corpus.documents`).

Shared by the training script (``python -m attnviz.tiny_gpt.train``), the pages that measure the shipped model on its
held-out text, and the scans, so that none imports another.
"""

from __future__ import annotations

import ast
import functools
import sysconfig
from pathlib import Path

HELD_OUT_SHARE = 0.1  # the shipped recipe's share of the documentation held out (the end of the text)


def documentation_topics() -> list[tuple[str, str]]:
    """Python's documentation topics (the text ``help()`` shows) as (topic, text), in a fixed order."""
    import pydoc_data.topics

    return [(name, pydoc_data.topics.topics[name]) for name in sorted(pydoc_data.topics.topics)]


def documentation_text() -> str:
    """Python's documentation topics in one text, in a fixed order."""
    return "\n\n".join(text for _, text in documentation_topics())


def standard_library_docstrings(min_chars: int = 80, *, named: bool = False):
    """Docstrings of the standard library's modules, classes and functions (tests and IDLE left out), in a fixed
    order: about 1.5 M characters of English prose about Python. One text joined by blank lines, or with
    ``named`` a list of (``module.qualified.name``, docstring). Parsing every module takes 10-20 s (once per
    process; :mod:`attnviz.corpus.documents` also keeps them on disk)."""
    found = parse_docstrings(min_chars)
    return found if named else "\n\n".join(text for _, text in found)


@functools.lru_cache(maxsize=2)
def parse_docstrings(min_chars: int = 80) -> list[tuple[str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if any(part in ("test", "tests", "idlelib", "site-packages") for part in parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        found += _named_docstrings(tree, module, min_chars)
    return found


def _named_docstrings(tree: ast.Module, module: str, min_chars: int) -> list[tuple[str, str]]:
    """The module's docstrings in ``ast.walk`` order (the order the tiny GPT was trained on), with their names."""
    names = {id(tree): module}
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names[id(child)] = f"{names.get(id(parent), module)}.{child.name}"
            elif id(parent) in names:
                names.setdefault(id(child), names[id(parent)])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= min_chars:
                found.append((names.get(id(node), module), doc))
    return found


def split_text(text: str, held_out_share: float) -> tuple[str, str]:
    """(training text, held-out text): the last ``held_out_share`` of the text is never trained on."""
    split = int(len(text) * (1 - held_out_share))
    return text[:split], text[split:]


# The sentences the app itself offers (the sidebar's default; the cross-attention example's decoder text; the
# pangram of the benchmarks): the bundled GPT's tokenizer keeps each of their words whole, so that a lecturer's
# first demo reads word by word on either bundled model.
DEFAULT_SENTENCE = "The cat sat on the mat because it was tired."
CROSS_ATTENTION_TARGET = "A kitten rested on the rug."
APP_SENTENCES = (DEFAULT_SENTENCE, CROSS_ATTENTION_TARGET, "The quick brown fox jumps over the lazy dog.")


def app_words() -> list[str]:
    """The words of :data:`APP_SENTENCES`, lower case, each once, in order."""
    words = [word.strip(".,").lower() for sentence in APP_SENTENCES for word in sentence.split()]
    return list(dict.fromkeys(word for word in words if word))


# English sentences of our own (not from the training text) for the "typed twice" test of the bundled GPT's
# induction head: the second copy should cost a fraction of the first, and greedy decoding should continue it.
REPEAT_SENTENCES = (
    "My grandmother keeps a small garden of tomatoes and basil behind her kitchen.",
    "The train to the coast was late again, so we bought coffee and waited on the platform.",
    "Every morning the baker opens his shop at six and sells warm bread to the neighbours.",
    "She painted the old wooden fence bright blue before the summer rain arrived.",
    "Our team spent the whole afternoon arguing about where to put the new sofa.",
    "A small brown dog followed the children all the way home from school.",
    "The museum closes early on Sundays, so plan to arrive before noon.",
    "He forgot his umbrella at the cinema and walked home through the storm.",
    "Fresh snow covered the mountain village, and the roads were quiet for days.",
    "The students built a tiny robot that could sort coloured beads into cups.",
    "When the lights went out, everyone in the restaurant started singing together.",
    "My brother learned to play the violin by watching videos late at night.",
    "The river flooded the fields near the farm after a week of heavy rain.",
    "We found an old map of the city hidden inside a book about birds.",
    "The doctor told him to drink more water and walk every evening.",
    "Tourists gathered on the bridge to watch the sun set behind the castle.",
    "Her cat sleeps on the warm windowsill and ignores everyone who walks past.",
    "The festival offered music, dancing and cheap food until long after midnight.",
    "After the meeting, the manager thanked the volunteers and handed out sandwiches.",
    "Two old friends met at the station and talked about their years abroad.",
    "The farmer sold apples, pears and honey at the market every Saturday.",
    "Nobody expected the shy new student to win the chess tournament.",
    "The ship sailed slowly out of the harbour while seagulls circled above.",
    "A strange noise in the attic kept the whole family awake until morning.",
)
