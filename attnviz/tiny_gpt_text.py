"""The text the bundled tiny GPT is trained and measured on: Python's own documentation (``pydoc_data.topics``,
shipped with every Python), split into the part it trains on and the held-out end it never sees.

Shared by the training script (``python -m attnviz.train_tiny``) and the pages that measure the shipped model on
its held-out text, so that neither imports the other.
"""

from __future__ import annotations

HELD_OUT_SHARE = 0.1  # the shipped recipe's share of the documentation held out (the end of the text)


def documentation_text() -> str:
    """Python's documentation topics (the text ``help()`` shows), in a fixed order."""
    import pydoc_data.topics

    return "\n\n".join(pydoc_data.topics.topics[name] for name in sorted(pydoc_data.topics.topics))


def split_text(text: str, held_out_share: float) -> tuple[str, str]:
    """(training text, held-out text): the last ``held_out_share`` of the text is never trained on."""
    split = int(len(text) * (1 - held_out_share))
    return text[:split], text[split:]
