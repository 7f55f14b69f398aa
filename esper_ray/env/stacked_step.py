"""The training step and epoch of N stacked hosts and their seeds (morpho/stacked.py, morpho/stacked_seeds.py): what
N envs' TrainSteps compute, in calls that each carry N hosts' work (issue 77; docs/design.md, "Many hosts per process").

Per host, as train_step.py's CPU path does for one: the mean cross-entropy of its own batch (the hosts' losses are
summed, so host i's gradient is its own loss's), its gradients clipped to `max_grad_norm` by its own norm, and an SGD
step with momentum and weight decay (StackedSGD). Host i's update is row i of each stacked tensor's. Each trained seed
likewise: its group's gradients clipped by each row's own norm, one StackedSGD per group (the seed optimizer's lr and
momentum). On each host's last batch the gradient telemetry (StackedTelemetry) reads the unclipped gradients of that
host's row, as GradientCapture reads a lone env's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from esper_ray.data.sharding import DeviceShard
from esper_ray.env.epoch import TrainStats
from esper_ray.env.gradient_telemetry import MEASURED_STAGES
from esper_ray.env.stacked_scalers import RowScalers
from esper_ray.env.train_step import Precision
from esper_ray.morpho.stacked import Rows, StackedCNNHosts
from esper_ray.morpho.stacked_seeds import StackedModel, StackedSeeds


class StackedSGD:
    """N hosts' SGD optimizers (one lr, momentum and weight decay, no dampening or Nesterov) over stacked tensors, in
    one fused call. The momentum buffers start at zero, which is where torch's SGD starts: its first step sets the
    buffer to the gradient, and 0 * momentum + gradient is the gradient, exactly. A tensor without a gradient is not
    stepped, as torch's SGD skips it (a gate's, while its seed is TRAINING); `stepped[k]` says whether tensor k ever was
    (torch would have given it a momentum buffer)."""

    def __init__(self, params: Sequence[torch.Tensor], *, lr: float, momentum: float, weight_decay: float) -> None:
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.momentum_buffers = [torch.zeros_like(p) for p in self.params]
        self.stepped = [False] * len(self.params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, rows: Rows = None) -> None:
        """Step every host, or only `rows` (the others keep their parameters and momentum)."""
        with_grad = [k for k, p in enumerate(self.params) if p.grad is not None]
        if not with_grad:
            return
        for k in with_grad:
            self.stepped[k] = True
        params = [self.params[k] for k in with_grad]
        grads, buffers = [p.grad for p in params], [self.momentum_buffers[k] for k in with_grad]
        stacked_all = params + buffers
        if rows is not None:
            params, grads, buffers = ([t[rows] for t in ts] for ts in (params, grads, buffers))  # type: ignore[index]
        torch._fused_sgd_(
            params,
            grads,
            buffers,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            lr=self.lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
            is_first_step=False,
        )
        if rows is not None:
            for stacked, new in zip(stacked_all, params + buffers):  # type: ignore[operator]
                stacked.index_copy_(0, rows, new)


def load_momentum(sgd: StackedSGD, rows: Sequence[tuple[torch.optim.Optimizer, Sequence[torch.Tensor]]]) -> None:
    """Row i of sgd's momentum from rows[i] = (an optimizer, its tensors in sgd.params' order), in place; a tensor
    without a buffer yet (SGD's first step) gets a zero row, which gives the same step. Starts sgd's count of what it
    stepped anew (store_momentum reads it)."""
    into, source, zero = [], [], []
    for i, (optimizer, params) in enumerate(rows):
        for buffer, p in zip(sgd.momentum_buffers, params, strict=True):
            momentum = optimizer.state[p].get("momentum_buffer")
            if momentum is None:
                zero.append(buffer[i])
            else:
                into.append(buffer[i])
                source.append(momentum)
    with torch.no_grad():
        if into:
            torch._foreach_copy_(into, source)
        if zero:
            torch._foreach_zero_(zero)
    sgd.stepped = [False] * len(sgd.params)


def store_momentum(sgd: StackedSGD, rows: Sequence[tuple[torch.optim.Optimizer, Sequence[torch.Tensor]]]) -> None:
    """Write row i of sgd's momentum back into rows[i]'s optimizer: into its buffer, or as a new one where the stack
    stepped a tensor that had none (as torch's SGD creates it); a tensor not stepped since load_momentum gets none."""
    into, source = [], []
    with torch.no_grad():
        for i, (optimizer, params) in enumerate(rows):
            for buffer, p, stepped in zip(sgd.momentum_buffers, params, sgd.stepped, strict=True):
                state = optimizer.state[p]
                if state.get("momentum_buffer") is not None:
                    into.append(state["momentum_buffer"])
                    source.append(buffer[i])
                elif stepped:
                    state["momentum_buffer"] = buffer[i].clone()
        if into:
            torch._foreach_copy_(into, source)


def clip_per_host(grads: list[torch.Tensor], max_norm: float) -> None:
    """clip_grad_norm_(host i's gradients, max_norm) for every host i at once: the norm of row i of all the stacked
    gradients, and row i scaled by min(1, max_norm / (norm + 1e-6)), as torch's does."""
    norms = torch.linalg.vector_norm(torch.cat([g.flatten(1) for g in grads], dim=1), dim=1)  # [N]
    factor = torch.clamp(max_norm / (norms + 1e-6), max=1.0)
    torch._foreach_mul_(grads, [factor.view(-1, *[1] * (g.dim() - 1)) for g in grads])


def sample_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy [M, B] of stacked logits [M, B, classes] (the head's [M, classes, B], transposed) against y [M,
    B]. Over the classes in the head's own layout: a CPU log_softmax over the last dim of [M * B, classes] took 150 us
    at 16 x 64 rows on one thread, this 8."""
    log_p = torch.log_softmax(logits.transpose(1, 2), dim=1)  # [M, classes, B]
    return -log_p.gather(1, y.unsqueeze(1)).squeeze(1)


def hits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Correct predictions [M] per row of stacked logits [M, B, classes]; made contiguous first, the CPU argmax over
    the classes is 8x faster than over the transposed head output."""
    return (logits.contiguous().argmax(dim=-1) == y).sum(dim=1)


class StackedTelemetry:
    """The gradient telemetry of each host's last batch (GradientCapture's, per row): `host_norms[i]` the norm of host
    i's per-tensor gradient norms, `seed_norms[i][slot]` the per-tensor norms of the seed there, for the seeds in
    MEASURED_STAGES, of the tensors that have a gradient (as SeedSlot.gradient_norms)."""

    def __init__(self, n: int) -> None:
        self.host_norms: list[torch.Tensor | None] = [None] * n
        self.seed_norms: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]

    def __call__(self, step: StackedTrainStep, running: list[int], measured: list[int]) -> None:
        """Record the norms of hosts `measured`, whose batches are rows of this step's (host running[k] in row k). The
        gradients are the stacked leaves', row i host i's (zero for hosts not running)."""
        host_grads = [p.grad for p in step.optimizer.params]
        per_tensor = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in host_grads], dim=1)  # type: ignore[union-attr]
        for host in measured:
            self.host_norms[host] = torch.linalg.vector_norm(per_tensor[host])
        for group, _ in step.seeds:
            for j, host in enumerate(group.hosts):
                if host in measured and group.slots[j].stage in MEASURED_STAGES:
                    grads = [p.grad[j] for p in group.parameters() if p.grad is not None]
                    if grads:
                        self.seed_norms[host][group.slot_id] = torch.stack([torch.linalg.vector_norm(g) for g in grads])

    def take(self, captured: StackedTelemetry) -> None:
        """Copies of the norms a captured step's telemetry holds (its graph rewrites them at each replay)."""
        for i, norm in enumerate(captured.host_norms):
            if norm is not None:
                self.host_norms[i] = norm.clone()
            for slot_id, norms in captured.seed_norms[i].items():
                self.seed_norms[i][slot_id] = norms.clone()


class StackedTrainStep:
    """One optimisation step of the stacked hosts and their seeds, each host on its own batch; loss sums and correct
    counts per host. `seeds`: each stacked seed group with its optimizer (none for the host alone)."""

    def __init__(
        self,
        hosts: StackedCNNHosts,
        optimizer: StackedSGD,
        max_grad_norm: float,
        seeds: Sequence[tuple[StackedSeeds, StackedSGD]] = (),
        precision: Precision | None = None,
        scalers: Sequence[torch.amp.GradScaler] | None = None,
    ) -> None:
        self.hosts, self.optimizer, self.max_grad_norm = hosts, optimizer, max_grad_norm
        self.seeds = list(seeds)
        self.precision = precision or Precision()
        fp16 = self.precision.dtype is torch.float16
        if fp16 != (scalers is not None) or (scalers is not None and len(scalers) != hosts.n):
            raise ValueError(
                "stacked hosts: fp16 takes each host's own GradScaler (scalers, one a host), bf16 and fp32 none"
            )
        self.scalers = RowScalers(scalers) if scalers is not None else None
        self.model = StackedModel(hosts, [group for group, _ in self.seeds])
        device = optimizer.params[0].device
        self.loss_sum = torch.zeros(hosts.n, device=device)
        self.correct = torch.zeros(hosts.n, dtype=torch.int64, device=device)

    def __call__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        rows: Rows = None,
        on_grads: Callable[[StackedTrainStep, list[int]], None] | None = None,
        capturing: bool = False,
    ) -> torch.Tensor:
        """x [M, B, C, H, W], y [M, B]: row k is host rows[k]'s batch (all hosts when rows is None). Returns the
        hosts' losses [M]. `on_grads(step, running)` reads the unclipped gradients (the telemetry). `capturing`: into a
        CUDA graph (env/held_stack.py; fp32 or bf16, all rows)."""
        with self.precision.autocast(x.device, capturing):  # bf16 on a GPU: as each env's own step (train_step.py)
            logits = self.model(x, rows=rows).float()  # [M, B, classes]
        losses = sample_losses(logits, y).mean(dim=1)  # each host's mean over its batch, as prediction_loss
        b = y.shape[1]
        self.optimizer.zero_grad()
        for _, sgd in self.seeds:
            sgd.zero_grad()
        running = list(range(self.hosts.n)) if rows is None else rows.tolist()
        (losses.sum() if self.scalers is None else self.scalers.scale(losses, running).sum()).backward()
        grads = [p.grad for p in self.optimizer.params]
        seed_grads = [[p.grad for p in sgd.params if p.grad is not None] for _, sgd in self.seeds]
        stepping = running  # the hosts whose host tensors step (fp16: those with finite gradients)
        seed_rows = [[j for j, host in enumerate(group.hosts) if host in running] for group, _ in self.seeds]
        if self.scalers is not None:  # each row unscaled by its own env's scale; non-finite rows skip their step
            finite = self.scalers.unscale(grads, range(self.hosts.n), running)
            stepping = [host for host in running if finite[host]]
            found_inf = {host: not finite[host] for host in running}
            for g, (group, _) in enumerate(self.seeds):
                finite = self.scalers.unscale(seed_grads[g], group.hosts, running)
                seed_rows[g] = [j for j in seed_rows[g] if finite[j]]
                for j, host in enumerate(group.hosts):
                    if host in found_inf:
                        found_inf[host] = found_inf[host] or not finite[j]
        if on_grads is not None:
            on_grads(self, running)
        clip_per_host(grads, self.max_grad_norm)  # type: ignore[arg-type]
        if stepping:
            whole = len(stepping) == self.hosts.n
            self.optimizer.step(None if whole else torch.tensor(stepping, device=x.device))
        for (group, sgd), grads_of, local in zip(self.seeds, seed_grads, seed_rows, strict=True):
            if not local or not grads_of:
                continue
            clip_per_host(grads_of, self.max_grad_norm)  # each seed by its own norm, as TrainStep clips it
            sgd.step(None if len(local) == len(group.hosts) else torch.tensor(local, device=x.device))
        if self.scalers is not None:
            self.scalers.update(found_inf)
        correct = hits(logits.detach(), y)
        if rows is None:
            self.loss_sum += losses.detach() * b
            self.correct += correct
        else:
            self.loss_sum.index_add_(0, rows, losses.detach() * b)
            self.correct.index_add_(0, rows, correct)
        return losses.detach()


def seed_optimizer(group: StackedSeeds) -> StackedSGD:
    """The group's StackedSGD, with its seeds' optimizer settings (group_key makes them one)."""
    settings = group.slots[0].optimizer.param_groups[0]  # type: ignore[union-attr]
    return StackedSGD(
        group.parameters(), lr=settings["lr"], momentum=settings["momentum"], weight_decay=settings["weight_decay"]
    )


def train_stacked_epoch(
    step: StackedTrainStep,
    shards: Sequence[DeviceShard],
    generators: Sequence[torch.Generator],
    prepares: Sequence[Callable[[torch.Tensor], torch.Tensor]],
    *,
    batch_size: int,
    telemetry: StackedTelemetry | None = None,
    run_whole: Callable[[torch.Tensor, torch.Tensor, list[int]], object] | None = None,
) -> list[TrainStats]:
    """One pass of host i over shard i, in the order its own generator draws (DeviceShard.epoch, as train_epoch does),
    batch j of every host in one step. Where the shards' lengths differ, batch j's hosts are stacked by batch size.
    `telemetry` reads each host's gradients on its last batch. `run_whole(x, y, last)` runs a step of every host in
    the step's place (a held stack's captured graphs), with `telemetry` of the hosts `last` whose last batch it is."""
    step.model.train()
    step.loss_sum.zero_()
    step.correct.zero_()
    epochs = [shard.epoch(g, prepare) for shard, g, prepare in zip(shards, generators, prepares, strict=True)]
    n_batches = [shard.num_batches(batch_size) for shard in shards]
    for j in range(max(n_batches)):
        start, by_size = j * batch_size, {}
        for i, (_, y_all) in enumerate(epochs):
            size = min(batch_size, len(y_all) - start)
            if size > 0:
                by_size.setdefault(size, []).append(i)
        for size, members in by_size.items():
            x = torch.stack([epochs[i][0][start : start + size] for i in members])
            y = torch.stack([epochs[i][1][start : start + size] for i in members])
            last = [i for i in members if n_batches[i] == j + 1] if telemetry is not None else []
            if run_whole is not None and len(members) == len(shards):
                run_whole(x, y, last)
                continue
            on_grads = None
            if last:
                on_grads = lambda s, running, last=last: telemetry(s, running, last)  # noqa: E731
            rows = None if len(members) == len(shards) else torch.tensor(members, device=x.device)
            step(x, y, rows=rows, on_grads=on_grads)
    loss_sums, corrects = step.loss_sum.tolist(), step.correct.tolist()
    return [
        TrainStats(batches=n_batches[i], samples=len(epochs[i][1]), loss_sum=loss_sums[i], correct=int(corrects[i]))
        for i in range(len(shards))
    ]
