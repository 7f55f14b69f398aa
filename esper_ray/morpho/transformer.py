"""GPT-style transformer host for byte-level language modelling, with named injection slots (DOMAIN.md section 3).

Modelled on karpathy/nanoGPT model.py (itself GPT-2: Radford et al. 2019): pre-norm blocks of causal
self-attention and a 4x GELU MLP, learned positional embeddings, and an output head tied to the token
embedding. Slot r0c{i} sees block i's output, the residual stream [B, T, d_model], before the next block
(and, for the last block, before the final LayerNorm).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Container
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from esper_ray.contracts.host import SlotSpec, Topology
from esper_ray.contracts.slots import action_order, parse_slot_id, slot_id
from esper_ray.contracts.transformer_host import TransformerHostConfig
from esper_ray.morpho.host_api import HostModule, SlotHook

TRANSFORMER_PRESETS: dict[str, TransformerHostConfig] = {
    # 2 CPU cores: 170,560 params (16,384 of them the tied byte embedding, 4,096 positional). One epoch of the
    # embedded corpus's train split (5,828 sequences of 64 bytes) at batch 64 takes 5-7 s with 2 threads
    # and 8-11 s with 1 (measured; see esper_ray/data/text.py).
    "text": TransformerHostConfig(vocab_size=256, seq_len=64, d_model=64, n_heads=4, n_layers=3),
    # GPUs: 4,870,144 params (65,536 tied byte embedding, 65,536 positional), 256-byte context. One epoch
    # of the embedded corpus (about 1,500 sequences of 256 bytes) at batch 64 took 0.46 s on an H200.
    "text-gpu": TransformerHostConfig(vocab_size=256, seq_len=256, d_model=256, n_heads=8, n_layers=6),
    # A starved host that seeds can rescue (as digits-impaired is for the CNN): the text host whose own attention
    # sees only the current byte, so it can at best learn which byte follows which (a bigram model). An
    # attention seed is the only way it gets context. Same parameters as "text".
    "text-starved": TransformerHostConfig(
        vocab_size=256, seq_len=64, d_model=64, n_heads=4, n_layers=3, attention_window=1
    ),
}


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position t attends to positions <= t only (with `window`, only to the
    last `window` of them, t included)."""

    def __init__(
        self, d_model: int, n_heads: int, dropout: float = 0.0, window: int | None = None, seq_len: int = 0
    ) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"n_heads={n_heads} does not divide d_model={d_model}")
        self.n_heads = n_heads
        self.dropout = dropout
        self.window = window
        if window is not None:  # banded causal mask: query t sees keys t - window + 1 .. t
            band = torch.ones(seq_len, seq_len, dtype=torch.bool).tril().triu(-(window - 1))
            self.register_buffer("band", band, persistent=False)
        self.qkv = nn.Linear(d_model, 3 * d_model)  # query, key and value of every head in one matmul
        self.proj = nn.Linear(d_model, d_model)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = (
            t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in self.qkv(x).split(C, dim=2)
        )  # (B, nh, T, hs)
        dropout_p = self.dropout if self.training else 0.0
        if self.window is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)  # (B, nh, T, hs)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=self.band[:T, :T], dropout_p=dropout_p
            )  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)  # heads side by side again
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, d_model: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, hidden)
        self.proj = nn.Linear(hidden, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(LN(x)), then x + mlp(LN(x))."""

    def __init__(self, cfg: TransformerHostConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.attention_window, cfg.seq_len)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg.d_model, cfg.mlp_hidden, cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TransformerHost(HostModule):
    """Byte embedding + positional embedding -> n_layers blocks -> LayerNorm -> head tied to the embedding.

    Same slot API as CNNHost: `slot_ids`, `slot_channels`, `slot_shape`, and `forward(idx, at_slot)`.
    """

    topology = Topology.TRANSFORMER

    def __init__(self, cfg: TransformerHostConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying (Press & Wolf 2017): one [vocab, d_model] matrix
        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layers) so the stream's variance does not
        # grow with depth (two residual branches per block).
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @classmethod
    def from_preset(cls, preset: str) -> TransformerHost:
        return cls(TRANSFORMER_PRESETS[preset])

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> TransformerHost:
        return cls(TransformerHostConfig(**description))

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self.cfg)

    def slots(self) -> list[SlotSpec]:
        return [SlotSpec(s, self.slot_shape(s), Topology.TRANSFORMER) for s in self.slot_ids]

    def example_input(self) -> torch.Tensor:
        return torch.zeros(1, self.cfg.seq_len, dtype=torch.long)

    @property
    def slot_ids(self) -> list[str]:
        return action_order(slot_id(0, i) for i in range(self.cfg.n_layers))

    def slot_channels(self, slot: str) -> int:
        if slot not in self.slot_ids:
            parse_slot_id(slot)
            raise ValueError(f"slot {slot!r} does not exist in this host; available slots: {self.slot_ids}")
        return self.cfg.d_model

    def slot_shape(self, slot: str) -> tuple[int, int]:
        """(T, C) of the features a slot sees: (seq_len, d_model) for a full-length sequence."""
        return self.cfg.seq_len, self.slot_channels(slot)

    def forward(
        self, idx: torch.Tensor, at_slot: SlotHook | None = None, hooked: Container[str] | None = None
    ) -> torch.Tensor:
        """Next-token logits [B, T, vocab] for token ids idx [B, T] (int64, T <= seq_len).

        `at_slot(slot_id, h)` receives the residual stream h [B, T, d_model] after each block and returns
        its replacement. logits[:, t] depends on idx[:, :t + 1] only (causal), provided the hook keeps that.
        `hooked`: the slots whose hook may change their features (None: every slot); the others' hooks are not called.
        """
        if idx.dim() != 2:
            raise ValueError(f"idx must be [B, T] token ids, got shape {tuple(idx.shape)}")
        B, T = idx.size()
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds the host's seq_len={self.cfg.seq_len}")
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x)  # (B, T, C)
            if at_slot is not None and (hooked is None or slot_id(0, i) in hooked):
                x = at_slot(slot_id(0, i), x)
        return self.head(self.ln_f(x))  # (B, T, vocab)
