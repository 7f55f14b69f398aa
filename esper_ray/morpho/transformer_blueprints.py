"""The seven transformer seed blueprints (DOMAIN.md section 4). Every seed maps [B, T, C] to the same shape.

All are residual, s = x + delta(x), and exact identities at birth (DOMAIN.md: "All transformer seeds are
identity at birth"): delta's last affine map (`last_affine()`) starts at zero, so delta(x) is exactly 0.
At birth only that last map receives gradient; the layers before it start learning after its first step.

Unlike the original, the attention and MLP seeds read LayerNorm(x) (pre-norm, like the host's blocks), so
they hold 2C more parameters than DOMAIN.md's counts.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from esper_ray.contracts.actions import TRANSFORMER_BLUEPRINTS, Blueprint, parse_blueprint
from esper_ray.contracts.fields import check_int
from esper_ray.morpho.fused_block import RECOMPILE_LIMIT

LORA_RANK = 8
LORA_LARGE_RANK = 32
ATTENTION_SEED_HEADS = 4


class NormSeed(nn.Module):
    """x + tanh(s) * (LayerNorm(x) - x); s starts at 0, so the seed is the identity at birth."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels)
        self.scale = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.scale) * (self.norm(x) - x)

    def last_affine(self) -> nn.Module | nn.Parameter:
        return self.scale


class LoRASeed(nn.Module):
    """x + up(down(x)) with a rank-`rank` bottleneck (Hu et al. 2021); `up` is zero at birth."""

    def __init__(self, channels: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(channels, rank, bias=False)
        self.up = nn.Linear(rank, channels, bias=False)
        nn.init.zeros_(self.up.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(self.down(x))

    def last_affine(self) -> nn.Module | nn.Parameter:
        return self.up


class MLPSeed(nn.Module):
    """x + fc2(gelu(fc1(LayerNorm(x)))) with `hidden` units; fc2 is zero at birth."""

    def __init__(self, channels: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels)
        self.fc1 = nn.Linear(channels, hidden)
        self.fc2 = nn.Linear(hidden, channels)
        nn.init.zeros_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))

    def last_affine(self) -> nn.Module | nn.Parameter:
        return self.fc2


def seed_heads(channels: int) -> int:
    """4 heads, or the largest count below 4 that divides `channels` (1 always does)."""
    return next(h for h in range(ATTENTION_SEED_HEADS, 0, -1) if channels % h == 0)


class AttentionSeed(nn.Module):
    """x + proj(causal multi-head self-attention(LayerNorm(x))); proj is zero at birth.

    Position t attends to positions <= t only, so the seed keeps the host's causality.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.n_heads = seed_heads(channels)
        self.norm = nn.LayerNorm(channels)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        qkv = self.qkv(self.norm(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in qkv)  # (B, nh, T, hs)
        y = self.attend(q, k, v).transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return x + self.proj(y)

    def last_affine(self) -> nn.Module | nn.Parameter:
        return self.proj


def _causal(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    return q_idx >= kv_idx


EAGER_NOTICE = "flex_attention called without torch.compile"
"""The start of torch's once-per-process notice that uncompiled flex_attention is unfused: here by choice."""


def eager_flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: object) -> torch.Tensor:
    """flex_attention run eagerly, as FlexAttentionSeed does by design (no torch.compile: correct, not fast), without
    torch's notice that it is then unfused: the notice is about that choice, not a fault. torch shows it once per
    process, so without this the first caller (a test, a loaded network) would print it, at random."""
    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=EAGER_NOTICE)
        return flex_attention(q, k, v, block_mask=block_mask)  # type: ignore[arg-type, return-value]


@functools.cache
def compiled_flex_attention() -> Callable[..., torch.Tensor]:
    """flex_attention through torch.compile, made once per process on first use (importing the compiler costs
    seconds). Compiled, FlexAttention runs as fused kernels; eager, torch computes it with a dense reference that
    runs many small kernels: a step of the seed (text-starved's shapes, bf16, H200) took 19.8 ms eager, 2.6 ms
    compiled, 2.5 ms for the attention seed (benchmarks/probes/flex_step.py; docs/performance.md)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)  # type: ignore[no-any-return]


COMPILED_FLEX_MIN_HEAD_DIM = 16
"""Inductor's flex_attention kernels need a head dimension of at least 16 (torch 2.11: "NYI: embedding dimension of
the query, key, and value must be at least 16"); a seed with narrower heads runs eagerly on a GPU too."""


class FlexAttentionSeed(AttentionSeed):
    """The attention seed computed by FlexAttention with a causal block mask (same parameters and math).

    On a GPU it runs through torch.compile (compiled_flex_attention: fused, once per process and shape) when its
    heads are at least COMPILED_FLEX_MIN_HEAD_DIM wide; otherwise, and on a CPU, eagerly, which materialises the
    full score matrix (correct, not fast; torch 2.13 has no CPU backward for it anyway). The mask is built once per
    (T, device) and cached. Check `flex_attention_available(device)` before training it. Only the compiled path
    can run inside a CUDA graph (`runs_in_cuda_graphs`).
    """

    def __init__(self, channels: int) -> None:
        super().__init__(channels)
        self._masks: dict[tuple[int, str], object] = {}

    def _mask(self, q: torch.Tensor) -> object:
        T = q.size(2)
        key = (T, str(q.device))
        if key not in self._masks:
            from torch.nn.attention.flex_attention import create_block_mask

            self._masks[key] = create_block_mask(_causal, None, None, T, T, device=q.device)
        return self._masks[key]

    def compiles(self, device: torch.device) -> bool:
        """Whether `attend` takes the compiled path on `device`: a GPU, and heads wide enough for Inductor."""
        return device.type == "cuda" and self.qkv.in_features // self.n_heads >= COMPILED_FLEX_MIN_HEAD_DIM

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.compiles(q.device):  # one compiled version per batch shape and grad
            # mode: train, its last batch, validation chunks
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                return compiled_flex_attention()(q, k, v, block_mask=self._mask(q))  # (B, nh, T, hs)
        return eager_flex_attention(q, k, v, self._mask(q))


def runs_in_cuda_graphs(seed: nn.Module) -> bool:
    """Whether a step in which `seed` runs may be captured in a CUDA graph. Not a flex_attention seed on its eager
    path: uncompiled flex_attention computes with torch's dense reference implementation
    (torch/_higher_order_ops/flex_attention.py), which makes tensors from Python scalars as it goes (the forward's
    `torch.tensor(-inf, device=scores.device)`, the backward's CPU `torch.tensor(0)` fed to `torch.where` on the
    GPU): pageable host-to-device copies, which capture refuses ("Cannot copy between CPU and CUDA tensors during
    CUDA graph capture unless the CPU tensor is pinned"). Its compiled path (a GPU, heads of 16 or more: every text
    task's) is fused kernels and captures; a captured text episode with it trains what the eager one does
    (tests/test_train_step.py, on a GPU). In the text A/B of issue 30 the greedy episodes that kept the seed
    uncaptured took 18.7-21.6 s against 2.3-6.4 s for the attention seed's."""
    if isinstance(seed, FlexAttentionSeed):
        return seed.compiles(next(seed.parameters()).device)
    return True


@functools.cache
def _probe_flex_attention(device: str) -> tuple[bool, str]:
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError as err:
        return False, f"flex_attention needs torch >= 2.5; this is torch {torch.__version__} ({err})"
    try:
        q = torch.randn(1, 1, 8, 8, device=device, requires_grad=True)
        mask = create_block_mask(_causal, None, None, 8, 8, device=device)
        eager_flex_attention(q, q, q, mask).sum().backward()
    except (NotImplementedError, RuntimeError, AssertionError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return False, f"flex_attention cannot train on {device!r} with torch {torch.__version__}: {first_line}"
    return True, f"flex_attention trains on {device!r} with torch {torch.__version__}"


def flex_attention_available(device: torch.device | str = "cpu") -> tuple[bool, str]:
    """Whether the flex_attention seed can train (forward and backward) on `device`, and why not.

    Probed once per device with a tiny forward and backward pass. torch 2.13 has no CPU backward for
    FlexAttention, so on CPU this is (False, reason); on CUDA it is normally available.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return (
                False,
                f"flex_attention cannot run on {str(dev)!r} with torch {torch.__version__}: CUDA is not available here",
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return _probe_flex_attention(str(dev))


_BUILDERS: dict[Blueprint, Callable[[int], nn.Module]] = {
    Blueprint.NORM: NormSeed,
    Blueprint.ATTENTION: AttentionSeed,
    Blueprint.LORA: lambda c: LoRASeed(c, LORA_RANK),
    Blueprint.LORA_LARGE: lambda c: LoRASeed(c, LORA_LARGE_RANK),
    Blueprint.MLP_SMALL: lambda c: MLPSeed(c, 2 * c),
    Blueprint.MLP: lambda c: MLPSeed(c, 4 * c),
    Blueprint.FLEX_ATTENTION: FlexAttentionSeed,
}
assert tuple(sorted(_BUILDERS)) == tuple(sorted(TRANSFORMER_BLUEPRINTS)), "every transformer blueprint needs a builder"


def resolve_transformer_blueprint(name: str | Blueprint) -> Blueprint:
    """Accept a Blueprint or its lower-case name; raise ValueError naming the transformer blueprints otherwise."""
    return parse_blueprint(name, TRANSFORMER_BLUEPRINTS, "transformer hosts")


def build_transformer_seed(
    blueprint: str | Blueprint, channels: int, device: torch.device | str = "cpu", *, inference_only: bool = False
) -> nn.Module:
    """A fresh seed for a slot of width `channels`, to be trained on `device`. No silent fallback.

    `device` only matters for flex_attention, which raises ValueError where it cannot train there, unless
    `inference_only` (a grown network being loaded: its forward runs on the CPU too, only the backward does not).
    The seed is built on the CPU; move it with `.to(device)`.
    """
    resolved = resolve_transformer_blueprint(blueprint)
    check_int("channels", channels, 1)
    if resolved is Blueprint.FLEX_ATTENTION and not inference_only:
        ok, reason = flex_attention_available(device)
        if not ok:
            raise ValueError(f"blueprint 'flex_attention' is not available: {reason}")
    return _BUILDERS[resolved](channels)
