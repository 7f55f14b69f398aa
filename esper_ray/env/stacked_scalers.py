"""fp16 in a stacked step: each host keeps its own env's GradScaler (DESIGN.md: one scaler per env, its scale reported),
applied to its own row (issue 77).

What a lone env's TrainStep does with its scaler (train_step.py), per row: the loss times the env's scale before the
backward pass; each optimizer's gradients times 1 / scale (`GradScaler.unscale_`, its reciprocal taken in float64 as
torch's is) with non-finite values noted; an optimizer whose gradients are not all finite skips its step
(`GradScaler.step`) while the env's other optimizers step; and the scale updated once a step from whether any of the
env's gradients were not finite (`GradScaler.update`: backed off, or grown after `growth_interval` clean steps, through
torch's own `_amp_update_scale_`). Rows of hosts that do not run this step are left alone, their scalers too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class RowScalers:
    """The GradScalers of N stacked hosts, `scalers[i]` host i's."""

    def __init__(self, scalers: Sequence[torch.amp.GradScaler]) -> None:
        self.scalers = list(scalers)

    def scale(self, losses: torch.Tensor, running: Sequence[int]) -> torch.Tensor:
        """losses [M] (row k host running[k]'s) times each host's own scale."""
        return torch.stack([self.scalers[host].scale(losses[k]) for k, host in enumerate(running)])

    def unscale(self, grads: Sequence[torch.Tensor | None], hosts: Sequence[int], running: Sequence[int]) -> list[bool]:
        """Divide row j of each stacked gradient by host hosts[j]'s scale (rows of hosts not running: untouched, their
        gradients are zero); whether each row's gradients are all finite."""
        present = [g for g in grads if g is not None]
        if not present:
            return [True] * len(hosts)
        device = present[0].device
        inverse = torch.ones(len(hosts), device=device)
        for j, host in enumerate(hosts):
            if host in running:
                inverse[j] = self.scalers[host]._scale.double().reciprocal().float()  # type: ignore[union-attr]
        torch._foreach_mul_(present, [inverse.view(-1, *[1] * (g.dim() - 1)) for g in present])
        finite = torch.stack([torch.isfinite(g.flatten(1)).all(dim=1) for g in present]).all(dim=0)
        return finite.tolist()

    def update(self, found_inf: dict[int, bool]) -> None:
        """Each running host's scale, from whether any of its gradients were not finite this step."""
        for host, inf in found_inf.items():
            scaler = self.scalers[host]
            torch._amp_update_scale_(
                scaler._scale,  # type: ignore[arg-type]
                scaler._growth_tracker,  # type: ignore[arg-type]
                torch.full((), float(inf), device=scaler._scale.device),  # type: ignore[union-attr]
                scaler._growth_factor,
                scaler._backoff_factor,
                scaler._growth_interval,
            )
