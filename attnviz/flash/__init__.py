"""Flash attention: the tiled online-softmax algorithm in PyTorch, a Triton kernel, and one entry point that calls
every contender the same way. Imports only torch, triton, numpy and the standard library (it runs on the GPU
machine as is).

- ``dispatch``: ``attention(q, k, v, backend=...)`` and the named ``CONTENDERS``; ``cases``: seeded inputs and
  their peak memory
- ``tiled``: FlashAttention-2's forward in PyTorch; ``triton_kernel``: forward and backward in Triton
- ``flex``: FlexAttention with our masks; ``ring``: Ring attention, simulated exactly
- ``cpu_sweep``: every CPU contender over lengths, time and peak memory (the Flash page and ``python -m attnviz.bench
  flash``)
"""
