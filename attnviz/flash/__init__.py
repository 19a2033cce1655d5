"""Flash attention: the tiled online-softmax algorithm in PyTorch, a Triton kernel, and one entry point that calls
every contender the same way. Imports only torch, triton, numpy and the standard library (it runs on the GPU
machine as is)."""

from attnviz.flash.dispatch import BACKENDS, BackendUnavailable, attention  # noqa: F401
from attnviz.flash.tiled import tiled_attention  # noqa: F401
