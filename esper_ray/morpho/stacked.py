"""N CNN hosts of one structure as one stacked module: one call computes N hosts' batches (issue 77).

Why: on a CPU a digits-impaired host (160-880 parameters) is bound by calls, not arithmetic: each of a batch's ~570
ATen calls sits near its per-call floor. Stacked, each call carries N hosts' work. Every tensor of host i is row i of
a stacked tensor with a new leading dimension, named as in the host's state_dict (what torch.func.stack_module_state
gives); each host keeps its own batch, batch-norm statistics and running buffers, and its own gradients, as if it
were trained alone (env/stacked_step.py steps them; tests/test_stacked_hosts.py checks it against N separate hosts).

How: features run as [N, C, B, H, W] (each host's channels, then its batch), so
- a 1x1 convolution (the impaired hosts) is one batched matrix product, [N, Cout, Cin] @ [N, Cin, B*H*W];
- a kxk convolution is one grouped convolution (groups=N) over the hosts' channels side by side;
- batch norm is one F.batch_norm over N*C channels (statistics per channel over B*H*W, as each host's own; the running
  buffers [N, C] are updated in place through flat views);
- the pool treats the N*C channels as its batch, and the head is one batched product.
The alternative, torch.func.vmap over functional_call of a CNNHost, computes the same and is slower on the CPU
(benchmarks/stacked_hosts.py measures both; docs/design.md, "Many hosts per process").

Rows: a step may train only some hosts (`rows`, an index tensor): at an epoch's end the envs' shards differ in length,
so their last batches differ in size and are stacked by size. Their tensors are gathered, and the buffers a training
forward updates are written back.

Slots: `forward` calls `at_slot(slot_id, h)` where CNNHost.forward does, with the stacked features h [M, C, B, H, W]
of the rows being run; `hooked` names the slots where any host has a live seed, as CNNHost's does. The stacked seeds
(morpho/stacked_seeds.py, StackedModel) hold, per slot and blueprint, one stacked seed for the hosts that planted it
there and blend its output back into those rows; hosts without a seed there pass their features through, as a dormant
slot does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Sequence

import torch
import torch.nn.functional as F

from esper_ray.contracts.host import HostConfig
from esper_ray.contracts.slots import slot_id
from esper_ray.morpho.host import CNNHost
from esper_ray.morpho.host_api import SlotHook

# False: a 1x1 convolution runs as the grouped convolution too (a switch for benchmarks/stacked_hosts.py, which
# measures both).
POINTWISE_AS_PRODUCT = True

Rows = torch.Tensor | None
"""Which hosts a call runs, as an int64 index tensor; None: all of them, in order."""


def check_one_structure(hosts: Sequence[CNNHost]) -> HostConfig:
    """The hosts' shared config; ValueError naming the first field that differs otherwise."""
    if not hosts:
        raise ValueError("stacked hosts: need at least one host, got none")
    for i, host in enumerate(hosts):
        if type(host) is not CNNHost:
            raise ValueError(f"stacked hosts: host {i} is a {type(host).__name__}; only CNNHost hosts stack")
    first = hosts[0].cfg
    for i, host in enumerate(hosts[1:], start=1):
        differ = [f.name for f in dataclasses.fields(HostConfig) if getattr(first, f.name) != getattr(host.cfg, f.name)]
        if differ:
            theirs = ", ".join(f"{name}={getattr(host.cfg, name)!r}" for name in differ)
            ours = ", ".join(f"{name}={getattr(first, name)!r}" for name in differ)
            raise ValueError(f"stacked hosts need one structure: host {i} has {theirs}; host 0 has {ours}")
        for j, (block, block0) in enumerate(zip(host.blocks, hosts[0].blocks, strict=True)):
            for name in ("momentum", "eps"):
                a, b = getattr(block0.norm, name), getattr(block.norm, name)
                if a != b:
                    raise ValueError(
                        f"stacked hosts need one structure: host {i} has blocks.{j}.norm.{name}={b!r}; host 0 has {a!r}"
                    )
    return first


class StackedCNNHosts:
    """N CNNHosts of one HostConfig, their parameters and buffers stacked along a leading dimension.

    `params` and `buffers` map each of a host's state_dict names to its stacked tensor ([N, *shape]; the parameters are
    leaves that take gradients). `forward` maps images [N, B, C, H, W] (host i's batch in row i) to logits [N, B,
    classes]."""

    def __init__(self, hosts: Sequence[CNNHost]) -> None:
        self.cfg = check_one_structure(hosts)
        self.n = len(hosts)
        # As torch.func.stack_module_state stacks them (leaves that take gradients; the buffers plain), in a third of
        # its time here: a stack is built whenever its group's structure changes.
        per_host = [(list(h.parameters()), list(h.buffers())) for h in hosts]
        names = [n for n, _ in hosts[0].named_parameters()], [n for n, _ in hosts[0].named_buffers()]
        with torch.no_grad():
            self.params: dict[str, torch.Tensor] = {
                name: torch.stack([p[k] for p, _ in per_host]).requires_grad_() for k, name in enumerate(names[0])
            }
            self.buffers: dict[str, torch.Tensor] = {
                name: torch.stack([b[k] for _, b in per_host]) for k, name in enumerate(names[1])
            }
        self.norms = [(b.norm.momentum, b.norm.eps) for b in hosts[0].blocks]
        if any(momentum is None for momentum, _ in self.norms):
            raise ValueError(
                "stacked hosts: batch norm momentum=None (a cumulative average) is not stacked; use a float"
            )
        self.training = True

    def train(self, mode: bool = True) -> StackedCNNHosts:
        self.training = mode
        return self

    def eval(self) -> StackedCNNHosts:
        return self.train(False)

    def parameters(self) -> list[torch.Tensor]:
        return list(self.params.values())

    def state_dict(self, host: int) -> dict[str, torch.Tensor]:
        """Host `host`'s tensors under CNNHost's names (views into the stack)."""
        return {k: v[host] for k, v in (self.params | self.buffers).items()}

    def load_from(self, hosts: Sequence[CNNHost]) -> None:
        """Copy each host's current tensors into its row, in place (a held stack's captured steps read these tensors),
        in one call; the hosts are those it was built from, or of their structure."""
        with torch.no_grad():
            torch._foreach_copy_(
                [v[i] for i in range(self.n) for v in (*self.params.values(), *self.buffers.values())],
                [t for h in hosts for t in (*h.parameters(), *h.buffers())],
            )

    def write_to(self, host: int, module: CNNHost) -> None:
        """Copy host `host`'s current tensors into a CNNHost of the same structure (in place, as load_state_dict
        does, in one call: the modules list their tensors in the stack's order)."""
        with torch.no_grad():
            torch._foreach_copy_(
                [*module.parameters(), *module.buffers()],
                [v[host] for v in (*self.params.values(), *self.buffers.values())],
            )

    def __call__(
        self, x: torch.Tensor, at_slot: SlotHook | None = None, hooked: Container[str] | None = None, rows: Rows = None
    ) -> torch.Tensor:
        return self.forward(x, at_slot, hooked, rows)

    def forward(
        self,
        x: torch.Tensor,
        at_slot: SlotHook | None = None,
        hooked: Container[str] | None = None,
        rows: Rows = None,
    ) -> torch.Tensor:
        """Logits [M, B, classes] of images [M, B, C, H, W], row k run by host rows[k] (M = N when rows is None).
        `at_slot` and `hooked` as in CNNHost.forward, on stacked features [M, C, B, H, W]."""
        params = self.params if rows is None else {k: v[rows] for k, v in self.params.items()}
        buffers = self.buffers if rows is None else {k: v[rows] for k, v in self.buffers.items()}
        if x.shape[0] != (self.n if rows is None else len(rows)):
            raise ValueError(f"stacked hosts: input has {x.shape[0]} rows of batches for {self.n} hosts, rows={rows}")
        cfg = self.cfg

        def reads(slot: str) -> bool:
            return at_slot is not None and (hooked is None or slot in hooked)

        h = x.transpose(1, 2)  # [M, C, B, H, W]
        for i in range(cfg.blocks):
            pooled, reads_before_pool = i < cfg.pool_layers, reads(slot_id(0, i))
            h = self._block(i, h, params, buffers, pool=pooled and not reads_before_pool)
            if reads_before_pool:
                h = at_slot(slot_id(0, i), h)  # type: ignore[misc]
                if pooled:
                    h = _pool(h)
            if pooled and reads(slot_id(1, i)):
                h = at_slot(slot_id(1, i), h)  # type: ignore[misc]
        features = h.mean(dim=(3, 4))  # [M, C, B]
        logits = torch.baddbmm(params["head.bias"].unsqueeze(2), params["head.weight"], features)  # [M, classes, B]
        if rows is not None and self.training:  # the batch norms updated the gathered buffers: keep their new values
            for k, v in buffers.items():
                self.buffers[k].index_copy_(0, rows, v)
        return logits.transpose(1, 2)

    def _block(
        self, i: int, h: torch.Tensor, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], pool: bool
    ) -> torch.Tensor:
        """Block i of all hosts: conv -> batch norm -> ReLU (-> max-pool), [M, Cin, B, H, W] -> [M, Cout, B, ...]."""
        weight = params[f"blocks.{i}.conv.weight"]  # [M, Cout, Cin, k, k]
        m, c_out, c_in, k = weight.shape[:4]
        batch, side = h.shape[2], h.shape[3]
        momentum, eps = self.norms[i]
        norm = f"blocks.{i}.norm."
        if self.training:
            buffers[norm + "num_batches_tracked"].add_(1)
        if k == 1 and POINTWISE_AS_PRODUCT:  # stride 1, no padding: a product over the channels, one for all hosts
            y = torch.bmm(weight.view(m, c_out, c_in), h.reshape(m, c_in, -1))  # [M, Cout, B*H*W]
        else:  # one grouped convolution over the hosts' channels side by side: [B, M*Cin, H, W] -> [B, M*Cout, H, W]
            y = F.conv2d(
                h.reshape(m * c_in, batch, side, side).transpose(0, 1),
                weight.reshape(m * c_out, c_in, k, k),
                padding=k // 2,
                groups=m,
            )
            y = y.transpose(0, 1).reshape(m, c_out, -1)
        y = F.batch_norm(
            y.view(1, m * c_out, -1),  # statistics per host and channel over its B*H*W values, as a host's own
            buffers[norm + "running_mean"].view(-1),
            buffers[norm + "running_var"].view(-1),
            params[norm + "weight"].reshape(-1),
            params[norm + "bias"].reshape(-1),
            self.training,
            momentum,
            eps,
        )
        y = torch.relu(y).view(m, c_out, batch, side, side)
        return _pool(y) if pool else y


def _pool(h: torch.Tensor) -> torch.Tensor:
    """2x2 max-pool of stacked features [M, C, B, H, W]: the M*C channels as the pool's batch, B as its channels.
    Without autograd (the validation pass) as the maximum of the four strided quarters: the same values, and on the
    CPU ~10x faster than max_pool2d on stacked features (16 hosts' [2, 359, 8, 8]: 0.37 against 4.2 ms). Not in
    training: on a tie (common here, 1x1 convolutions of a digit's blank pixels) torch.maximum splits the gradient
    where max_pool2d gives it to one input."""
    m, c, b, side = h.shape[:4]
    if not torch.is_grad_enabled() and side % 2 == 0:
        top, bottom = h[..., 0::2, :], h[..., 1::2, :]
        return torch.maximum(
            torch.maximum(top[..., 0::2], top[..., 1::2]), torch.maximum(bottom[..., 0::2], bottom[..., 1::2])
        )
    return F.max_pool2d(h.reshape(m * c, b, side, side), 2).view(m, c, b, side // 2, side // 2)
