"""N hosts stacked as one module (morpho/stacked.py, env/stacked_step.py) train as N separate hosts do with the
project's own CPU step (env/epoch.py's train_epoch): the same losses, correct counts, gradients, parameters, momentum,
batch-norm running statistics and eval-mode outputs, to float rounding.

Tolerance: rtol 1e-4 and atol 1e-5 in fp32 (gradients and momentum atol 1e-4: GRAD_TOLERANCE). The two paths sum in
other orders (a batched matrix product for the 1x1 convolutions against a linear layer per host, the batch norm's
statistics over another memory layout), which moves results by ~1e-6, and SGD carries that from step to step. Compared
are two epochs (11-12 steps a host) of well-conditioned hosts (init seeds 1-3), whose weights of order 0.1-1 then
differ by less than 1e-5. A host with a near-zero first block (init seed 0: a block-0 weight of -0.0075, its variance
near the batch norm's eps) turns such rounding into 1e-3 within an epoch, as any two summation orders would; that is
no test of the stacking.
"""

from __future__ import annotations

import copy

import pytest
import torch

from esper_ray.data.datasets import load_digits
from esper_ray.data.sharding import DeviceShard, shard_indices
from esper_ray.env.epoch import train_epoch
from esper_ray.env.morphogenetic_env import HOST_MOMENTUM, HOST_WEIGHT_DECAY
from esper_ray.env.stacked_step import StackedSGD, StackedTrainStep, train_stacked_epoch
from esper_ray.env.train_step import Accumulators, Precision, TrainStep
from esper_ray.morpho.host import CNNHost, host_preset
from esper_ray.morpho.model import MorphogeneticModel
from esper_ray.morpho.stacked import StackedCNNHosts

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
# Gradients and momentum: the gradient of a convolution's weight that a batch norm follows is a near-cancelling sum (the
# loss does not change with the weight's scale), so its rounding is of the size of the other gradients' (~0.1) times
# 1e-4, not of its own (seen: 1.7e-5 on a momentum of 8e-4).
GRAD_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
LR, BATCH = 0.05, 64
# Between the hosts' first gradient norms (0.28-0.78): some steps clip, some do not, by each host's own norm.
MAX_GRAD_NORM = 0.4
INIT_SEEDS = (1, 2, 3)


def hosts(preset: str = "digits-impaired") -> list[CNNHost]:
    out = []
    for seed in INIT_SEEDS:
        torch.manual_seed(seed)
        out.append(CNNHost(host_preset(preset)))
    return out


def separate(host: CNNHost) -> tuple[MorphogeneticModel, torch.optim.SGD]:
    """A host as an env holds it (a dormant slot, the env's optimizer on the CPU path)."""
    model = MorphogeneticModel(copy.deepcopy(host), ["r0c1"])
    optimizer = torch.optim.SGD(
        model.host.parameters(), lr=LR, momentum=HOST_MOMENTUM, weight_decay=HOST_WEIGHT_DECAY, fused=True
    )
    return model, optimizer


def stacked(host_list: list[CNNHost]) -> tuple[StackedCNNHosts, StackedSGD, StackedTrainStep]:
    module = StackedCNNHosts(host_list)
    sgd = StackedSGD(module.parameters(), lr=LR, momentum=HOST_MOMENTUM, weight_decay=HOST_WEIGHT_DECAY)
    return module, sgd, StackedTrainStep(module, sgd, MAX_GRAD_NORM)


@pytest.fixture(scope="module")
def data():  # type: ignore[no-untyped-def]
    return load_digits()


def shards(data) -> list[DeviceShard]:  # type: ignore[no-untyped-def]
    """Shards of 360, 360 and 300 samples: 6, 6 and 5 batches, the last ones 40, 40 and 44 samples (stacked by size)."""
    out = []
    for k, keep in enumerate((None, None, 300)):
        idx = shard_indices(len(data.train_y), k, 3)[:keep]
        out.append(DeviceShard(data.train_x[idx], data.train_y[idx], torch.device("cpu")))
    return out


def test_stacked_step_gives_each_host_its_own_loss_and_clipped_gradients(data) -> None:  # type: ignore[no-untyped-def]
    host_list = hosts()
    module, _, step = stacked(host_list)
    x = data.prepare(data.train_x[: 3 * BATCH]).view(3, BATCH, 1, 8, 8)
    y = data.train_y[: 3 * BATCH].view(3, BATCH)
    losses = step(x, y)
    clipped = 0
    for i, host in enumerate(host_list):
        model, optimizer = separate(host)
        acc = Accumulators(torch.device("cpu"))
        TrainStep(model, optimizer, Precision(), MAX_GRAD_NORM, acc)(x[i], y[i])
        torch.testing.assert_close(losses[i], acc.loss_sum / BATCH, **TOLERANCE)
        grads = [p.grad for p in model.host.parameters()]
        clipped += torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])).item() > MAX_GRAD_NORM * 0.999
        for (name, p), stacked_p in zip(model.host.named_parameters(), module.parameters(), strict=True):
            torch.testing.assert_close(stacked_p.grad[i], p.grad, **GRAD_TOLERANCE, msg=f"host {i} grad {name}")
            torch.testing.assert_close(stacked_p[i], p, **TOLERANCE, msg=f"host {i} {name}")
    assert 0 < clipped < 3  # one host clipped and one not: a clip over all hosts together would fail above


def test_stacked_epochs_train_as_separate_hosts(data) -> None:  # type: ignore[no-untyped-def]
    host_list, shard_list = hosts(), shards(data)
    module, sgd, step = stacked(host_list)
    separates = [separate(h) for h in host_list]
    for epoch in range(2):
        seeds = [100 * epoch + i for i in range(3)]  # each host's own data order
        together = train_stacked_epoch(
            step, shard_list, [torch.Generator().manual_seed(s) for s in seeds], [data.prepare] * 3, batch_size=BATCH
        )
        for i, ((model, optimizer), shard) in enumerate(zip(separates, shard_list, strict=True)):
            alone = train_epoch(
                model,
                optimizer,
                shard,
                batch_size=BATCH,
                generator=torch.Generator().manual_seed(seeds[i]),
                prepare=data.prepare,
                precision=Precision(),
                max_grad_norm=MAX_GRAD_NORM,
            )
            assert (together[i].batches, together[i].samples) == (alone.batches, alone.samples)
            assert together[i].correct == alone.correct, (epoch, i)
            assert together[i].loss == pytest.approx(alone.loss, rel=TOLERANCE["rtol"]), (epoch, i)
    assert [s.batches for s in together] == [6, 6, 5]
    val_x = data.prepare(data.val_x)
    logits = module.eval()(val_x.expand(3, *val_x.shape))
    for i, (model, optimizer) in enumerate(separates):
        host = model.host
        for name, value in host.state_dict().items():  # parameters, running statistics, batches tracked
            torch.testing.assert_close(module.state_dict(i)[name].detach(), value, **TOLERANCE, msg=f"host {i} {name}")
        for p, buffer in zip(host.parameters(), sgd.momentum_buffers, strict=True):
            torch.testing.assert_close(buffer[i], optimizer.state[p]["momentum_buffer"], **GRAD_TOLERANCE)
        with torch.no_grad():
            torch.testing.assert_close(logits[i], host.eval()(val_x), **TOLERANCE, msg=f"host {i} eval logits")


def test_stacked_forward_calls_slot_hooks_on_each_hosts_features() -> None:
    """A hook at a slot sees host i's features in row i: doubling host 1's at r0c1 is host 1 with that hook."""
    host_list = hosts("digits")  # 3x3 convolutions: the grouped path
    module = StackedCNNHosts(host_list).eval()
    x = torch.randn(3, 5, 1, 8, 8)

    def double_host_1(slot: str, h: torch.Tensor) -> torch.Tensor:
        return torch.cat([h[:1], 2 * h[1:2], h[2:]]) if slot == "r0c1" else h

    with torch.no_grad():
        logits = module(x, double_host_1, hooked={"r0c1"})
        for i, host in enumerate(host_list):
            hook = (lambda s, h: 2 * h if s == "r0c1" else h) if i == 1 else None
            torch.testing.assert_close(logits[i], host.eval()(x[i], hook, {"r0c1"}), **TOLERANCE)


def test_stacked_rows_train_only_those_hosts(data) -> None:  # type: ignore[no-untyped-def]
    """A step over some rows leaves the other hosts' parameters, momentum and running statistics as they were."""
    module, sgd, step = stacked(hosts())
    x = data.prepare(data.train_x[: 3 * BATCH]).view(3, BATCH, 1, 8, 8)
    y = data.train_y[: 3 * BATCH].view(3, BATCH)
    step(x, y)
    before = {k: v.detach().clone() for k, v in (module.params | module.buffers).items()}
    momentum = [b.clone() for b in sgd.momentum_buffers]
    step(x[[0, 2]], y[[0, 2]], rows=torch.tensor([0, 2]))
    for name, value in (module.params | module.buffers).items():
        torch.testing.assert_close(value[1].detach(), before[name][1], rtol=0, atol=0, msg=name)
        assert not torch.equal(value[0], before[name][0]), name
    for old, new in zip(momentum, sgd.momentum_buffers, strict=True):
        assert torch.equal(old[1], new[1]) and not torch.equal(old[2], new[2])


def test_stacked_hosts_refuse_different_structures() -> None:
    torch.manual_seed(0)
    impaired, digits = CNNHost(host_preset("digits-impaired")), CNNHost(host_preset("digits"))
    message = "host 1 has base_channels=8, kernel_size=3; host 0 has base_channels=2, kernel_size=1"
    with pytest.raises(ValueError, match=rf"^stacked hosts need one structure: {message}$"):
        StackedCNNHosts([impaired, digits])
