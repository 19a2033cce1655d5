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
