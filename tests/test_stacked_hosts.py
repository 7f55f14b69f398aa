"""N hosts stacked as one module (morpho/stacked.py, env/stacked_step.py), and with their seeds
(morpho/stacked_seeds.py), train as N separate hosts and models do with the project's own CPU step (env/epoch.py's
train_epoch): the same losses, correct counts, gradients, parameters, momentum, batch-norm running statistics,
eval-mode outputs and the seeds' gradient telemetry, to float rounding.

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
import torch.nn.functional as F

from esper_ray.contracts.actions import AlphaCurve, Style
from esper_ray.contracts.lifecycle import LifecycleConfig
from esper_ray.contracts.stages import Stage
from esper_ray.data.datasets import load_digits
from esper_ray.data.sharding import DeviceShard, shard_indices
from esper_ray.env.epoch import train_epoch, validate_fused
from esper_ray.env.gradient_telemetry import GradientCapture
from esper_ray.env.held_stack import seed_rows
from esper_ray.env.morphogenetic_env import HOST_MOMENTUM, HOST_WEIGHT_DECAY
from esper_ray.env.stacked_step import (
    StackedSGD,
    StackedTelemetry,
    StackedTrainStep,
    load_momentum,
    seed_optimizer,
    store_momentum,
    train_stacked_epoch,
)
from esper_ray.env.stacked_validation import validate_stacked
from esper_ray.env.train_step import Accumulators, Precision, TrainStep
from esper_ray.morpho.blueprints import CNN_BUILDERS
from esper_ray.morpho.counterfactual import build_plan
from esper_ray.morpho.host import CNNHost, host_preset
from esper_ray.morpho.model import MorphogeneticModel
from esper_ray.morpho.stacked import StackedCNNHosts
from esper_ray.morpho.stacked_seeds import GROUPED_MAX_CHANNELS, conv_rows, stack_seeds, unstackable

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
# Gradients and momentum: the gradient of a convolution's weight that a batch norm follows is a near-cancelling sum (the
# loss does not change with the weight's scale), so its rounding is of the size of the other gradients' (~0.1) times
# 1e-4, not of its own (seen: 1.7e-5 on a momentum of 8e-4).
GRAD_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
# A host's momentum after epochs of a seeded model, against its largest (the sums of GRAD_TOLERANCE's kind add up).
MOMENTUM_TOLERANCE = 1e-3
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


def train_alone(model, optimizer, shard, seed: int, prepare, on_last_batch=None):  # type: ignore[no-untyped-def]
    """One epoch of one model as a lone env trains it (train_epoch), the reference every stacked epoch is held to."""
    return train_epoch(
        model,
        optimizer,
        shard,
        batch_size=BATCH,
        generator=torch.Generator().manual_seed(seed),
        prepare=prepare,
        precision=Precision(),
        max_grad_norm=MAX_GRAD_NORM,
        on_last_batch=on_last_batch,
    )


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
            alone = train_alone(model, optimizer, shard, seeds[i], data.prepare)
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


# Seeds per model (issue 77, cut 4): two models with conv_light in r0c1 blended at different alphas and stages (one
# group), a third with conv_light there still TRAINING (straight-through, its gate unused: a group of its own), a
# fourth with another blueprint there (attention, gated), and a MULTIPLY norm seed in r1c1 beside the second's; the
# fifth has none. BLENDED_LR differs from the seed lr, as blended_seed_lr makes it from BLENDING on.
SEEDED = (
    (("r0c1", "conv_light", Style.LINEAR_ADD, Stage.BLENDING, 0.3),),
    (
        ("r0c1", "conv_light", Style.SIGMOID_ADD, Stage.HOLDING, 1.0),
        ("r1c1", "norm", Style.LINEAR_MULTIPLY, Stage.BLENDING, 0.6),
    ),
    (("r0c1", "conv_light", Style.GATED_GATE, Stage.TRAINING, 0.0),),
    (("r0c1", "attention", Style.GATED_GATE, Stage.BLENDING, 0.5),),
    (),
)
BLENDED_LR = 0.03
SEEDED_INIT = (1, 2, 3, 4, 5)


def seeded_models() -> list[tuple[MorphogeneticModel, torch.optim.SGD]]:
    """Five models as envs hold them, their seeds planted and moved to their stages by hand (gates aside)."""
    out = []
    for seed, plan in zip(SEEDED_INIT, SEEDED, strict=True):
        torch.manual_seed(seed)
        host = CNNHost(host_preset("digits-impaired"))
        model, optimizer = separate(host)
        model = MorphogeneticModel(model.host, ["r0c1", "r1c1"], LifecycleConfig(blended_seed_lr=BLENDED_LR))
        for slot_id, blueprint, style, stage, alpha in plan:
            slot = model.slot(slot_id)
            assert slot.germinate(blueprint, style)
            slot.stage = stage
            slot.alpha_value.fill_(alpha)
            if stage is not Stage.TRAINING:
                for group in slot.optimizer.param_groups:  # type: ignore[union-attr]
                    group["lr"] = BLENDED_LR
            if blueprint == "conv_light":  # default init is not small; give the blend a seed that differs per model
                with torch.no_grad():
                    for p in slot.seed.parameters():  # type: ignore[union-attr]
                        p.mul_(0.5 + 0.1 * seed)
        out.append((model, optimizer))
    return out


def stacked_seeded(models: list[tuple[MorphogeneticModel, torch.optim.SGD]]):  # type: ignore[no-untyped-def]
    """The stacked hosts and seeds of the models, their optimizers' momentum loaded as env/held_stack.HeldStack does."""
    module = StackedCNNHosts([m.host for m, _ in models])
    sgd = StackedSGD(module.parameters(), lr=LR, momentum=HOST_MOMENTUM, weight_decay=HOST_WEIGHT_DECAY)
    load_momentum(sgd, [(opt, list(m.host.parameters())) for m, opt in models])
    groups = stack_seeds([m.seed_slots() for m, _ in models])
    seeds = []
    for group in groups:
        seed_sgd = seed_optimizer(group)
        load_momentum(seed_sgd, seed_rows(group))
        seeds.append((group, seed_sgd))
    return module, sgd, seeds, StackedTrainStep(module, sgd, MAX_GRAD_NORM, seeds)


def test_seeds_stack_in_groups_of_slot_blueprint_and_stage_kind() -> None:
    groups = stack_seeds([m.seed_slots() for m, _ in seeded_models()])
    found = sorted((g.slot_id, g.slots[0].blueprint.key, g.training, tuple(g.hosts)) for g in groups)  # type: ignore[union-attr]
    assert found == [
        ("r0c1", "attention", False, (3,)),
        ("r0c1", "conv_light", False, (0, 1)),
        ("r0c1", "conv_light", True, (2,)),
        ("r1c1", "norm", False, (1,)),
    ]


def test_stacked_step_with_seeds_gives_each_model_its_own_gradients(data) -> None:  # type: ignore[no-untyped-def]
    """One step: losses, the clipped gradients and new parameters of every host and seed, as each model's TrainStep."""
    models = seeded_models()
    module, _, seeds, step = stacked_seeded(copy.deepcopy(models))
    n = len(models)
    x = data.prepare(data.train_x[: n * BATCH]).view(n, BATCH, 1, 8, 8)
    y = data.train_y[: n * BATCH].view(n, BATCH)
    losses = step(x, y)
    for i, (model, optimizer) in enumerate(models):
        acc = Accumulators(torch.device("cpu"))
        TrainStep(model, optimizer, Precision(), MAX_GRAD_NORM, acc)(x[i], y[i])
        torch.testing.assert_close(losses[i], acc.loss_sum / BATCH, **TOLERANCE)
        for (name, p), stacked_p in zip(model.host.named_parameters(), module.parameters(), strict=True):
            torch.testing.assert_close(stacked_p.grad[i], p.grad, **GRAD_TOLERANCE, msg=f"host {i} grad {name}")
            torch.testing.assert_close(stacked_p[i], p, **TOLERANCE, msg=f"host {i} {name}")
    checked = 0
    for group, _ in seeds:
        for j, host in enumerate(group.hosts):
            slot = models[host][0].slot(group.slot_id)
            for name, p in zip(group.names, slot.seed_parameters(), strict=True):
                stacked_p = group.params[name]
                assert (stacked_p.grad is None) == (p.grad is None), (host, name)
                if p.grad is not None:
                    torch.testing.assert_close(stacked_p.grad[j], p.grad, **GRAD_TOLERANCE, msg=f"{host} {name}")
                    checked += p.grad.abs().sum().item() > 0
                torch.testing.assert_close(stacked_p[j], p, **TOLERANCE, msg=f"model {host} seed {name}")
    assert checked >= 10


def test_stacked_seeds_under_autocast_give_each_model_its_own_logits(data) -> None:  # type: ignore[no-untyped-def]
    """Under bf16 autocast (the GPU's AMP, here on the CPU) the stack gives each model's own logits, its seeds' fp32
    rows and bf16 host features mixed as a lone model mixes them. On CUDA index_copy refused that mix until the stack
    widened the features; CPU autocast promotes it, so the GPU test of tests/test_vector_env.py guards that."""
    models = seeded_models()
    _, _, _, step = stacked_seeded(copy.deepcopy(models))
    n = len(models)
    x = data.prepare(data.train_x[: n * BATCH]).view(n, BATCH, 1, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stacked = step.model(x).float()
        alone = [model(x[i]).float() for i, (model, _) in enumerate(models)]
    for i in range(n):
        torch.testing.assert_close(stacked[i], alone[i], rtol=2e-2, atol=2e-2, msg=f"model {i}")


def test_stacked_epochs_with_seeds_train_as_separate_models(data) -> None:  # type: ignore[no-untyped-def]
    """Two epochs on shards of unequal length (last batches stacked by size, groups partly present): losses, correct
    counts, the gradient telemetry of each model's last batch, then every host's and seed's parameters and momentum."""
    models = seeded_models()
    stacked_models = copy.deepcopy(models)
    module, sgd, seeds, step = stacked_seeded(stacked_models)
    n = len(models)
    shard_list = []
    for k, keep in enumerate((None, None, 150, None, None)):  # 216 x 4 and 215 samples: 4 batches, 3 for model 2
        idx = shard_indices(len(data.train_y), k, n)[:keep]
        shard_list.append(DeviceShard(data.train_x[idx], data.train_y[idx], torch.device("cpu")))
    for epoch in range(2):
        seeds_ = [100 * epoch + i for i in range(n)]
        telemetry = StackedTelemetry(n)
        together = train_stacked_epoch(
            step,
            shard_list,
            [torch.Generator().manual_seed(s) for s in seeds_],
            [data.prepare] * n,
            batch_size=BATCH,
            telemetry=telemetry,
        )
        for i, ((model, optimizer), shard) in enumerate(zip(models, shard_list, strict=True)):
            capture = GradientCapture(model)
            alone = train_alone(model, optimizer, shard, seeds_[i], data.prepare, on_last_batch=capture)
            assert (together[i].batches, together[i].samples) == (alone.batches, alone.samples)
            assert together[i].correct == alone.correct, (epoch, i)
            assert together[i].loss == pytest.approx(alone.loss, rel=TOLERANCE["rtol"]), (epoch, i)
            torch.testing.assert_close(telemetry.host_norms[i], capture.host_norm, **TOLERANCE)
            assert telemetry.seed_norms[i].keys() == capture.seed_norms.keys(), i
            for slot_id, norms in capture.seed_norms.items():
                torch.testing.assert_close(telemetry.seed_norms[i][slot_id], norms, **GRAD_TOLERANCE)
    assert sorted(k for norms in telemetry.seed_norms for k in norms) == ["r0c1", "r0c1", "r0c1", "r1c1"]
    for group, seed_sgd in seeds:
        group.write_back()
        store_momentum(seed_sgd, seed_rows(group))
    for i, ((model, optimizer), (theirs, _)) in enumerate(zip(models, stacked_models, strict=True)):
        module.write_to(i, theirs.host)
        for name, value in model.state_dict().items():
            torch.testing.assert_close(theirs.state_dict()[name], value, **TOLERANCE, msg=f"model {i} {name}")
        theirs_momentum = [optimizer.state[p]["momentum_buffer"] for p in model.host.parameters()]
        largest = max(b.abs().max().item() for b in theirs_momentum)
        for name, buffer, b in zip(module.params, sgd.momentum_buffers, theirs_momentum, strict=True):
            # over two epochs of a seeded model the near-cancelling sums add up (tests/test_vector_env.py compares a
            # host's momentum to its largest alike): seen 1.7e-4 on model 2's blocks.2.conv.weight, its largest 0.27
            assert (buffer[i] - b).abs().max().item() <= MOMENTUM_TOLERANCE * largest, f"model {i} momentum {name}"
        for slot, their_slot in zip(model.seed_slots(), theirs.seed_slots(), strict=True):
            for p, q in zip(slot.seed_parameters(), their_slot.seed_parameters(), strict=True):
                a = slot.optimizer.state[p].get("momentum_buffer")  # type: ignore[union-attr]
                b = their_slot.optimizer.state[q].get("momentum_buffer")  # type: ignore[union-attr]
                assert (a is None) == (b is None), (i, slot.slot_id)
                if a is not None:
                    torch.testing.assert_close(b, a, **GRAD_TOLERANCE, msg=f"model {i} {slot.slot_id} momentum")
    gate = stacked_models[2][0].slot("r0c1").gate
    assert gate is not None and not stacked_models[2][0].slot("r0c1").optimizer.state[gate.net[0].weight]  # type: ignore[union-attr]


def test_seeds_that_cannot_stack_are_refused_by_name() -> None:
    """A prune ramping a seed down (its frozen gradients are read again by the telemetry) and a seed module that is no
    built-in blueprint's keep their model out of a stack."""
    model = seeded_models()[0][0]
    slot = model.slot("r0c1")
    slot.pruning = True
    assert unstackable(slot) == "slot r0c1: a prune is ramping its seed down"
    with pytest.raises(ValueError, match="^stacked seeds: model 0's slot r0c1: a prune is ramping its seed down$"):
        stack_seeds([model.seed_slots()])
    slot.pruning = False
    slot.seed = torch.nn.Identity()
    assert unstackable(slot) == "slot r0c1: seed module Identity is not a built-in blueprint's"


@pytest.mark.parametrize("channels", [2, GROUPED_MAX_CHANNELS, 2 * GROUPED_MAX_CHANNELS])
def test_conv_rows_convolve_each_row_as_its_own_convolution(channels: int) -> None:
    """conv_rows (one grouped channels-last convolution up to GROUPED_MAX_CHANNELS, one convolution a row above) gives
    each row what F.conv2d of its own batch and weight gives: the output, and the gradients of both."""
    gen = torch.Generator().manual_seed(channels)
    rows, batch = 3, 5
    h = torch.randn(rows, batch, channels, 8, 8, generator=gen, requires_grad=True)
    weight = torch.randn(rows, channels, channels, 3, 3, generator=gen, requires_grad=True)
    upstream = torch.randn(rows, batch, channels, 8, 8, generator=gen)
    out = conv_rows(h, weight)
    out.backward(upstream)
    for r in range(rows):
        h_r, weight_r = h.detach()[r].requires_grad_(), weight.detach()[r].requires_grad_()
        alone = F.conv2d(h_r, weight_r, padding=1)
        alone.backward(upstream[r])
        torch.testing.assert_close(out[r], alone)
        torch.testing.assert_close(h.grad[r], h_r.grad)  # type: ignore[index]
        torch.testing.assert_close(weight.grad[r], weight_r.grad)  # type: ignore[index]


@pytest.mark.parametrize("style", [Style.LINEAR_ADD, Style.LINEAR_MULTIPLY, Style.GATED_GATE])
def test_every_builtin_blueprint_stacks_as_it_trains_alone(data, style) -> None:  # type: ignore[no-untyped-def]
    """Every CNN blueprint under every blend, two models blending it in r0c1 at alphas 0.4 and 0.8 (one group): one
    step gives each seed the gradient and new parameters of its model's own TrainStep."""
    models = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = MorphogeneticModel(CNNHost(host_preset("digits-impaired")), ["r0c1"])
        models.append(model)
    x = data.prepare(data.train_x[: 2 * BATCH]).view(2, BATCH, 1, 8, 8)
    y = data.train_y[: 2 * BATCH].view(2, BATCH)
    for blueprint in CNN_BUILDERS:
        pairs = []
        for model, alpha in zip(models, (0.4, 0.8), strict=True):
            model.slot("r0c1")._reset_state()
            assert model.slot("r0c1").germinate(blueprint, style)
            model.slot("r0c1").stage = Stage.BLENDING
            model.slot("r0c1").alpha_value.fill_(alpha)
            with torch.no_grad():  # away from the identity at birth, so every tensor's gradient is tested
                for p in model.slot("r0c1").seed_parameters():
                    p.add_(0.1 * torch.randn_like(p))
            optimizer = torch.optim.SGD(model.host.parameters(), lr=LR, momentum=HOST_MOMENTUM, fused=True)
            pairs.append((copy.deepcopy(model), optimizer))
        _, _, seeds, step = stacked_seeded(pairs)
        ((group, _),) = seeds
        step(x, y)
        for j, model in enumerate(models):
            TrainStep(
                model,
                torch.optim.SGD(model.host.parameters(), lr=LR),
                Precision(),
                MAX_GRAD_NORM,
                Accumulators(torch.device("cpu")),
            )(x[j], y[j])
            for name, p in zip(group.names, model.slot("r0c1").seed_parameters(), strict=True):
                where = f"{blueprint} {style.name} model {j} {name}"
                torch.testing.assert_close(group.params[name].grad[j], p.grad, **GRAD_TOLERANCE, msg=where)
                torch.testing.assert_close(group.params[name][j], p, **TOLERANCE, msg=where)


def test_stacked_validation_gives_each_model_its_own_fused_pass(data) -> None:  # type: ignore[no-untyped-def]
    """The five seeded models (blended, held, TRAINING, gated and MULTIPLY seeds; K = 2, 5, 1, 2 and 1 configurations
    from build_plan) validated in one stacked pass (env/stacked_validation.py) against each model's own validate_fused:
    the same correct count and loss for every configuration. Model 2's set is shorter and the chunk smaller than the
    sets, so chunks of unequal size stack apart; model 4 has a prepare of its own."""
    models = []
    for i, (model, optimizer) in enumerate(seeded_models()):
        idx = shard_indices(len(data.train_y), i, 5)  # an epoch each, so that hosts and seeds tell classes apart
        train_alone(
            model, optimizer, DeviceShard(data.train_x[idx], data.train_y[idx], torch.device("cpu")), i, data.prepare
        )
        for slot in model.seed_slots():
            if slot.is_active and slot.stage is not Stage.TRAINING:  # the schedule too, which build_plan reads
                slot._set_alpha(slot.alpha_value.item(), 0, AlphaCurve.LINEAR)
            with torch.no_grad():  # away from the identity at birth (the norm seed), so every configuration differs
                for p in slot.seed_parameters():
                    p.add_(0.1 * torch.randn_like(p))
        models.append(model)
    plans = [build_plan(m) for m in models]
    assert [p.alphas.shape[0] for p in plans] == [2, 5, 1, 2, 1]
    sets = [(data.val_x[:keep], data.val_y[:keep]) for keep in (None, None, 300, None, None)]
    prepares = [data.prepare] * 4 + [lambda x: 0.9 * data.prepare(x)]
    before = [copy.deepcopy(m.state_dict()) for m in models]
    together = validate_stacked(
        models, [x for x, _ in sets], [y for _, y in sets], [p.alphas for p in plans], chunk=128, prepares=prepares
    )
    for i, (model, plan, (x, y), prepare) in enumerate(zip(models, plans, sets, prepares, strict=True)):
        alone = validate_fused(model, x, y, plan.alphas, chunk=128, prepare=prepare, precision=Precision())
        assert together[i].samples == alone.samples and together[i].correct == alone.correct, i
        assert together[i].loss_sum == pytest.approx(alone.loss_sum, rel=TOLERANCE["rtol"]), i
        for name, value in before[i].items():  # eval mode: no running statistics updated, nothing trained
            assert torch.equal(model.state_dict()[name], value), (i, name)
    # Every configuration is its own, not the main one repeated (model 1's pair off and all off are one configuration).
    assert [len(set(v.loss_sum)) for v in together] == [2, 4, 1, 2, 1], together


def test_fp16_rows_scale_skip_and_back_off_by_their_own_scaler(data) -> None:  # type: ignore[no-untyped-def]
    """fp16, each host with its own GradScaler: host 0's scale (2^100) overflows its gradients, so its step is skipped
    (parameters and momentum untouched) and its scale halves, as its lone TrainStep's GradScaler does; hosts 1 and 2
    (2^8 and 2^10) step as their own TrainSteps in fp16 do, their scales unchanged."""
    host_list = hosts()
    scales = (2.0**100, 2.0**8, 2.0**10)
    module = StackedCNNHosts(host_list)
    sgd = StackedSGD(module.parameters(), lr=LR, momentum=HOST_MOMENTUM, weight_decay=HOST_WEIGHT_DECAY)
    scalers = [torch.amp.GradScaler("cpu", init_scale=s) for s in scales]
    step = StackedTrainStep(module, sgd, MAX_GRAD_NORM, precision=Precision(torch.float16), scalers=scalers)
    before = [p.detach().clone() for p in module.parameters()]
    x = data.prepare(data.train_x[: 3 * BATCH]).view(3, BATCH, 1, 8, 8)
    y = data.train_y[: 3 * BATCH].view(3, BATCH)
    step(x, y)
    for i, host in enumerate(host_list):
        model, optimizer = separate(host)
        alone = torch.amp.GradScaler("cpu", init_scale=scales[i])
        TrainStep(model, optimizer, Precision(torch.float16, alone), MAX_GRAD_NORM, Accumulators(torch.device("cpu")))(
            x[i], y[i]
        )
        assert scalers[i].get_scale() == alone.get_scale(), f"host {i}"
        for (name, p), stacked_p, old in zip(model.host.named_parameters(), module.parameters(), before, strict=True):
            torch.testing.assert_close(stacked_p[i], p, rtol=1e-3, atol=1e-4, msg=f"host {i} {name}")
            if i == 0:
                assert torch.equal(stacked_p[i], old[i]), f"host 0 {name} stepped"
                assert torch.equal(sgd.momentum_buffers[0][0], torch.zeros_like(sgd.momentum_buffers[0][0]))
            else:
                assert not torch.equal(stacked_p[i], old[i]), f"host {i} {name} did not step"
    assert [s.get_scale() for s in scalers] == [2.0**99, 2.0**8, 2.0**10]
