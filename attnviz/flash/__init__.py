"""Flash attention: the tiled online-softmax algorithm in PyTorch, a Triton kernel, and one entry point that calls
every contender the same way. Imports only torch, triton, numpy and the standard library (it runs on the GPU
machine as is)."""

from attnviz.flash.dispatch import (  # noqa: F401
    BACKENDS,
    CONTENDERS,
    BackendUnavailable,
    attention,
    run_contender,
)
from attnviz.flash.tiled import tiled_attention  # noqa: F401
