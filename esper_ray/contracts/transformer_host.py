"""Transformer host shape (DOMAIN.md section 3): a GPT-style byte-level language model."""

from __future__ import annotations

from dataclasses import dataclass

from esper_ray.contracts.fields import check_int


@dataclass(frozen=True)
class TransformerHostConfig:
    vocab_size: int = 256
    """Tokens the model reads and predicts (256: one token per byte)."""
    seq_len: int = 64
    """Block size: the longest sequence the learned positional embedding covers, in tokens."""
    d_model: int = 64
    """Width of the residual stream; every slot sees [B, T, d_model]."""
    n_heads: int = 4
    """Attention heads per block; must divide d_model (each head is d_model // n_heads wide)."""
    n_layers: int = 3
    """Transformer blocks; slot r0c{i} sits after block i."""
    mlp_ratio: int = 4
    """Hidden width of each block's MLP, in multiples of d_model (GPT-2 uses 4)."""
    dropout: float = 0.0
    """Dropout after the embeddings, on the attention weights and after each residual branch (0 = off)."""
    attention_window: int | None = None
    """Positions each query of the host's own attention sees: itself and the `attention_window - 1` before it
    (None = the whole causal context). A small window starves the host of context; seeds do not have one."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "n_heads", "n_layers", "mlp_ratio"):
            check_int(name, getattr(self, name), 1)
        if self.d_model % self.n_heads != 0:
            divisors = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0 and h <= 16]
            raise ValueError(
                f"n_heads={self.n_heads} does not divide d_model={self.d_model}; "
                f"choose n_heads from {divisors} or change d_model"
            )
        if self.attention_window is not None:
            check_int("attention_window", self.attention_window, 1)
        if (
            not isinstance(self.dropout, (int, float))
            or isinstance(self.dropout, bool)
            or not 0.0 <= self.dropout < 1.0
        ):
            raise ValueError(f"dropout={self.dropout!r}: must be a number in [0, 1)")

    @property
    def mlp_hidden(self) -> int:
        return self.mlp_ratio * self.d_model
