"""A few-layer causal transformer in plain torch, small enough to train on CPU.

It exists to give the demo a real training step (forward, backward, optimizer)
with a real checkpoint, not to be a good language model.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.nn import functional as F


@dataclasses.dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Shape of the demo model.

    Attributes:
        vocab_size: Number of token ids (the dataset's tokenizer vocab, specials included).
        dim: Width of the residual stream.
        num_layers: Number of transformer blocks.
        num_heads: Attention heads per block; must divide ``dim``.
        max_seq_len: Longest sequence the learned position table covers.
    """

    vocab_size: int
    dim: int = 128
    num_layers: int = 2
    num_heads: int = 4
    max_seq_len: int = 1024


class _Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.attn_norm = nn.LayerNorm(config.dim)
        self.qkv = nn.Linear(config.dim, 3 * config.dim, bias=False)
        self.attn_out = nn.Linear(config.dim, config.dim, bias=False)
        self.mlp_norm = nn.LayerNorm(config.dim)
        self.mlp_in = nn.Linear(config.dim, 4 * config.dim, bias=False)
        self.mlp_out = nn.Linear(4 * config.dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, dim = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(dim, dim=-1)
        heads = (batch, seq_len, self.num_heads, dim // self.num_heads)
        q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_out(attn.transpose(1, 2).reshape(batch, seq_len, dim))
        return x + self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(x))))


class TinyTransformer(nn.Module):
    """Token embedding, learned positions, pre-norm blocks, tied output head."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.dim % config.num_heads:
            raise ValueError(f"model dim {config.dim} is not a multiple of num_heads {config.num_heads}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.pos = nn.Embedding(config.max_seq_len, config.dim)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.dim)
        # Small embeddings keep the tied head's first logits near zero,
        # so the loss starts near ln(vocab_size) instead of in the hundreds.
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return logits of shape ``[batch, seq_len, vocab_size]`` for int64 ``tokens``."""
        seq_len = tokens.shape[1]
        if seq_len > self.config.max_seq_len:
            raise ValueError(f"sequence length {seq_len} exceeds the model's max_seq_len {self.config.max_seq_len}")
        positions = torch.arange(seq_len, device=tokens.device)
        x = self.embed(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.T
