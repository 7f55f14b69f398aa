"""Where an env trains and in what precision: its device (auto: CUDA where there is one) and its AMP mode."""

from __future__ import annotations

import warnings

import torch

from esper_ray.contracts.env_config import MIXED_AMP_MODES
from esper_ray.env.train_step import Precision


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r}: CUDA is not available here; use device='cpu' or 'auto'")
    return device


def resolve_amp(amp: str, device: torch.device) -> str:
    """The precision `amp` means on `device`: fp32, bf16 or fp16 (auto: bf16 on a CUDA GPU that has it; off: fp32)."""
    if device.type != "cuda" or amp in ("off", "fp32"):
        return "fp32"
    if amp == "auto":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return amp


def precision_of(amp: str, device: torch.device) -> Precision:
    if amp in MIXED_AMP_MODES and device.type != "cuda":
        warnings.warn(f"amp={amp} applies on CUDA only; this env trains on the {device.type} in fp32", stacklevel=3)
    amp = resolve_amp(amp, device)
    if amp == "fp32":
        return Precision()
    if amp == "bf16":
        if not torch.cuda.is_bf16_supported():
            raise ValueError("amp='bf16': this GPU has no bf16 support; use amp='fp16' or 'fp32'")
        return Precision(dtype=torch.bfloat16)
    return Precision(dtype=torch.float16, scaler=torch.amp.GradScaler("cuda"))
