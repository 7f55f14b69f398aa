"""Random crop (zero padding 4) and horizontal flip, per sample, on the batch's own device."""

from __future__ import annotations

import torch


def crop_and_flip(x: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """x: [B, C, H, W] -> same shape; every sample gets its own crop offset and flip."""
    b, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (padding, padding, padding, padding))
    dy = torch.randint(0, 2 * padding + 1, (b, 1), generator=generator, device=x.device)
    dx = torch.randint(0, 2 * padding + 1, (b, 1), generator=generator, device=x.device)
    rows = dy + torch.arange(h, device=x.device)  # [B, H]
    cols = dx + torch.arange(w, device=x.device)  # [B, W]
    batch = torch.arange(b, device=x.device)[:, None, None]
    cropped = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # [B, H, W, C]
    cropped = cropped.permute(0, 3, 1, 2)
    flip = torch.rand(b, generator=generator, device=x.device) < 0.5
    return torch.where(flip[:, None, None, None], cropped.flip(3), cropped)
