"""PagedAttention's KV cache (Kwon et al., 2023, vLLM), simulated exactly with real tensors.

A contiguous KV cache reserves room for the maximum length of every sequence up front. A paged cache instead cuts
K and V into fixed-size **blocks** (16 tokens by default) taken from one pool, and keeps a **block table** per
sequence: logical block i of the sequence lives in physical block ``table[i]``. Memory is taken a block at a time
as tokens arrive, so the only waste is the unused end of each sequence's last block. Sequences that share a
prefix (several samples of one prompt) share its physical blocks; a shared block is copied only when one of them
writes into it (**copy-on-write**), counted by a reference count per block.

Attention reads a sequence's K/V by gathering its blocks through the table, then runs the same arithmetic as on a
contiguous cache: the results are identical, not merely close.

Shapes: one layer; ``k, v [kv_heads, head_dim]`` per token; a physical block is ``[kv_heads, block_size, d]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnviz.core import masks
from attnviz.core.attention import scaled_dot_product_attention


@dataclass
class CacheEvent:
    """What one append did: wrote into a block, took a new one, or copied a shared block before writing."""

    sequence: str
    position: int
    kind: str  # "write", "allocate" or "copy-on-write"
    block: int  # the physical block written
    source: int | None = None  # copy-on-write: the shared block copied


@dataclass
class PagedKVCache:
    """A pool of physical K/V blocks and a block table per sequence (see the module docstring)."""

    kv_heads: int
    head_dim: int
    block_size: int = 16
    dtype: torch.dtype = torch.float32
    key_blocks: list[torch.Tensor] = field(default_factory=list)  # physical blocks, [kv_heads, block_size, d]
    value_blocks: list[torch.Tensor] = field(default_factory=list)
    references: list[int] = field(default_factory=list)  # sequences whose table holds each physical block
    free: list[int] = field(default_factory=list)  # physical blocks no table holds, reused first
    tables: dict[str, list[int]] = field(default_factory=dict)
    lengths: dict[str, int] = field(default_factory=dict)
    events: list[CacheEvent] = field(default_factory=list)
    # Which token each slot of each physical block holds (a number per appended token, copied with its block):
    # a copy-on-write copy holds the same tokens again
    slot_tokens: list[list[int | None]] = field(default_factory=list)
    appended: int = 0  # tokens appended so far (the next token's number)

    def add_sequence(self, name: str) -> None:
        if name in self.tables:
            raise ValueError(f"sequence {name!r} exists already")
        self.tables[name], self.lengths[name] = [], 0

    def fork(self, parent: str, child: str) -> None:
        """``child`` starts as a copy of ``parent``: it shares every block (no copy until one of them writes)."""
        self.add_sequence(child)
        self.tables[child] = list(self.tables[parent])
        self.lengths[child] = self.lengths[parent]
        for block in self.tables[child]:
            self.references[block] += 1

    def _new_block(self) -> int:
        if self.free:
            block = self.free.pop()
            self.references[block] = 1
            self.slot_tokens[block] = [None] * self.block_size
            return block
        shape = (self.kv_heads, self.block_size, self.head_dim)
        self.key_blocks.append(torch.zeros(shape, dtype=self.dtype))
        self.value_blocks.append(torch.zeros(shape, dtype=self.dtype))
        self.references.append(1)
        self.slot_tokens.append([None] * self.block_size)
        return len(self.key_blocks) - 1

    def append(self, name: str, key: torch.Tensor, value: torch.Tensor) -> CacheEvent:
        """Store one token's ``key, value [kv_heads, d]`` at the end of sequence ``name``."""
        table, position = self.tables[name], self.lengths[name]
        logical, slot = divmod(position, self.block_size)
        if logical == len(table):  # the last block is full (or there is none): take a fresh one
            table.append(self._new_block())
            event = CacheEvent(name, position, "allocate", table[-1])
        elif self.references[table[logical]] > 1:  # shared with another sequence: copy before writing
            shared = table[logical]
            copy = self._new_block()
            self.key_blocks[copy].copy_(self.key_blocks[shared])
            self.value_blocks[copy].copy_(self.value_blocks[shared])
            self.slot_tokens[copy] = list(self.slot_tokens[shared])
            self.references[shared] -= 1
            table[logical] = copy
            event = CacheEvent(name, position, "copy-on-write", copy, shared)
        else:
            event = CacheEvent(name, position, "write", table[logical])
        block = table[logical]
        self.key_blocks[block][:, slot] = key
        self.value_blocks[block][:, slot] = value
        self.slot_tokens[block][slot] = self.appended
        self.appended += 1
        self.lengths[name] = position + 1
        self.events.append(event)
        return event

    def remove(self, name: str) -> None:
        """A finished sequence gives its blocks back (a shared block stays while another table holds it)."""
        for block in self.tables.pop(name):
            self.references[block] -= 1
            if self.references[block] == 0:
                self.free.append(block)
        self.lengths.pop(name)

    def gather(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's K and V ``[kv_heads, length, d]``, read through its block table."""
        table, length = self.tables[name], self.lengths[name]
        if not table:
            empty = torch.zeros(self.kv_heads, 0, self.head_dim, dtype=self.dtype)
            return empty, empty.clone()
        keys = torch.cat([self.key_blocks[b] for b in table], dim=1)[:, :length]
        values = torch.cat([self.value_blocks[b] for b in table], dim=1)[:, :length]
        return keys, values

    def attention(self, name: str, queries: torch.Tensor, *, causal_offset: bool = True) -> torch.Tensor:
        """Attention of ``queries [heads, n_q, d]`` (the sequence's last n_q tokens) over its cached K/V, with
        attnviz's attention on the gathered blocks; ``causal_offset``: query i sees keys up to its own position."""
        keys, values = self.gather(name)
        n_q, n_k = queries.shape[-2], keys.shape[-2]
        mask = masks.causal(n_q, n_k) if causal_offset else None
        output, _ = scaled_dot_product_attention(queries[None], keys[None], values[None], mask=mask)
        return output[0]

    def memory(self, max_length: int) -> dict[str, int | float]:
        """The paged cache's bytes (blocks in use) against a contiguous cache that reserves ``max_length`` tokens
        per sequence; internal fragmentation = allocated slots no token fills (the ends of last blocks).

        ``tokens_stored``: the slots that hold a token (a block shared by several tables counted once; a
        copy-on-write copy holds its tokens again); ``distinct_tokens``: how many different tokens those slots
        hold; ``most_copies``: the most slots any one token is held in."""
        token_bytes = 2 * self.kv_heads * self.head_dim * torch.tensor([], dtype=self.dtype).element_size()
        in_use = len(self.key_blocks) - len(self.free)
        allocated_slots = in_use * self.block_size
        stored = 0
        copies: dict[int, int] = {}
        counted: set[int] = set()
        for name, table in self.tables.items():
            for logical, block in enumerate(table):
                if block in counted:
                    continue
                counted.add(block)
                filled = min(self.block_size, self.lengths[name] - logical * self.block_size)
                stored += filled
                for token in self.slot_tokens[block][:filled]:
                    copies[token] = copies.get(token, 0) + 1
        return {
            "sequences": len(self.tables), "blocks_in_use": in_use, "block_bytes": self.block_size * token_bytes,
            "paged_bytes": allocated_slots * token_bytes,
            "contiguous_bytes": len(self.tables) * max_length * token_bytes,
            "tokens_stored": stored, "wasted_slots": allocated_slots - stored,
            "distinct_tokens": len(copies), "most_copies": max(copies.values(), default=0),
            "fragmentation": (allocated_slots - stored) / allocated_slots if allocated_slots else 0.0,
            "logical_tokens": sum(self.lengths.values()),
        }
