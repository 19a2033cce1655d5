"""What the "Generation and KV cache" page computes.

- ``decode``: a decoder generating token by token with its real KV cache, and without one
- ``reading``: what a finished generation shows, read from its steps
- ``sequence``: one head's attention over the whole sequence; ``heads``: the page's head finder
- ``systems``: PagedAttention and ring attention on real generations
- ``request``: the settings in use as the decoder and the caches take them
- ``figures``: the page's figures with their captions; ``summaries``: what it says in words and tables beside them
"""
