"""Long texts that ship with Python, for trying long inputs offline."""

from __future__ import annotations

SAMPLE_TOPICS = ("if", "while", "for", "try", "with", "function", "class", "assignment", "import", "exceptions",
                 "execmodel", "naming", "types", "datamodel", "specialnames", "numbers", "sequence-types",
                 "typesseq", "typesmapping", "formatstrings")


def sample_text() -> str:
    """English prose from Python's own documentation (``pydoc_data.topics``, shipped with every Python): about
    120,000 words, enough for any length a model reads."""
    from pydoc_data.topics import topics

    chosen = [topics[name] for name in SAMPLE_TOPICS if name in topics]
    rest = [text for name, text in sorted(topics.items()) if name not in SAMPLE_TOPICS]
    return "\n\n".join(chosen + rest)
