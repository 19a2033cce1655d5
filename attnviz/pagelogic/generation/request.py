"""The Generation page's request: the settings in use (applied by its Generate button), as the decoder and the
page's caches take them, and the prompt its "Repeat my prompt" button types twice."""

from __future__ import annotations

from attnviz.pagelogic.generation.decode import Sampling


def doubled(prompt: str) -> str:
    """The prompt typed twice: the second copy after a space, unless the first ends with a space or a newline."""
    return prompt + ("" if not prompt or prompt[-1].isspace() else " ") + prompt


def sampling_of(request: dict, seed_offset: int = 0) -> Sampling:
    """How the request draws its tokens; ``seed_offset`` gives the other samples of the same prompt."""
    return Sampling(request["strategy"], request["temperature"], request["top_k"], request["top_p"],
                    request["seed"] + seed_offset)


def sampling_key(sampling: Sampling) -> tuple:
    """A :class:`Sampling` as a cache key (the caches rebuild it with ``Sampling(*key)``)."""
    return (sampling.strategy, sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed)


def generation_key(folder: str, name: str, request: dict) -> tuple:
    """What a generation depends on: the figures drawn from it are cached by this and their own settings."""
    return (folder, name, request["prompt"], request["new_tokens"], sampling_key(sampling_of(request)),
            request["keep"])
