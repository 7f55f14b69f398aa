"""FLOPs counted from module shapes (morpho/flops.py) against hand counts, and torch's FlopCounterMode as an
independent check where it counts the same operations (it does not see attention on the CPU)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from esper_ray.contracts.actions import CNN_BLUEPRINTS, Blueprint
from esper_ray.contracts.host import Topology
from esper_ray.contracts.lifecycle import LifecycleConfig
from esper_ray.contracts.stages import Stage
from esper_ray.morpho.blueprints import build_seed
from esper_ray.morpho.counterfactual import build_plan
from esper_ray.morpho.flops import FlopCounter, gate_flops, host_flops, seed_flops
from esper_ray.morpho.hosts import build_host
from esper_ray.morpho.model import MorphogeneticModel
from tests.morpho_helpers import drive_to

# digits-impaired host: 1 -> 2 -> 4 -> 8 channels, 1x1 convs, 8x8 images pooled after blocks 0 and 1, head 8 -> 10
HOST_HAND = 2 * 1 * 2 * 8 * 8 + 2 * 2 * 4 * 4 * 4 + 2 * 4 * 8 * 2 * 2 + 2 * 8 * 10  # = 256 + 256 + 256 + 160 = 928
BEFORE_R0C1 = 256 + 256  # blocks 0 and 1 run before slot r0c1 (after block 1, before its pooling)
# conv_heavy at r0c1 (4 channels, 4x4): two 3x3 convs 4 -> 4
CONV_HEAVY_HAND = 2 * (2 * 4 * 4 * 3 * 3 * 4 * 4)  # = 9,216


def counted_by_torch(module: torch.nn.Module, x: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(x)
    return counter.get_total_flops()


def test_host_and_seed_forward_flops_equal_a_hand_count():
    flops = host_flops("digits-impaired")
    assert flops.forward == HOST_HAND == 928
    assert flops.before_slot["r0c1"] == BEFORE_R0C1 and flops.order == ("r0c0", "r1c0", "r0c1", "r1c1", "r0c2")
    assert seed_flops(Blueprint.CONV_HEAVY, Topology.CNN, (4, 4, 4)) == CONV_HEAVY_HAND
    # squeeze-excite on C = 8 (r0c2 of digits-impaired): Linear 8 -> 2, Linear 2 -> 8 on the pooled vector
    assert seed_flops(Blueprint.ATTENTION, Topology.CNN, (8, 2, 2)) == 2 * 8 * 2 + 2 * 2 * 8
    # the GATE blend's gate: Linear(C, max(8, C/4)) -> Linear(., 1) on the pooled vector
    assert gate_flops(Topology.CNN, (4, 4, 4)) == 2 * 4 * 8 + 2 * 8 * 1


def test_text_host_forward_flops_equal_a_hand_count():
    """text preset: d 64, 4 heads, 3 layers, T 64, MLP 256, vocab 256 (tied head)."""
    t, c, hidden, vocab = 64, 64, 256, 256
    per_layer = (
        2 * t * c * 3 * c + 2 * (2 * t * t * c) + 2 * t * c * c + 2 * (2 * t * c * hidden)
    )  # qkv, QK^T+AV, proj, MLP
    assert host_flops("text").forward == 3 * per_layer + 2 * t * c * vocab == 24_117_248
    assert (
        seed_flops(Blueprint.ATTENTION, Topology.TRANSFORMER, (t, c))
        == 2 * t * c * 3 * c + 2 * (2 * t * t * c) + 2 * t * c * c
    )
    assert seed_flops(Blueprint.LORA, Topology.TRANSFORMER, (t, c)) == 2 * t * c * 8 * 2


@pytest.mark.parametrize("blueprint", CNN_BLUEPRINTS)
def test_cnn_counts_agree_with_torch_flop_counter(blueprint):
    assert host_flops("digits").forward == counted_by_torch(build_host("digits").eval(), torch.zeros(1, 1, 8, 8))
    assert seed_flops(blueprint, Topology.CNN, (16, 4, 4)) == counted_by_torch(
        build_seed(blueprint, 16), torch.zeros(1, 16, 4, 4)
    )


def test_transformer_counts_agree_with_torch_flop_counter_apart_from_attention():
    """FlopCounterMode does not count the CPU attention kernel: ours minus the attention matmuls must equal it."""
    t, c, layers = 64, 64, 3
    attention = 2 * (2 * t * t * c)
    assert host_flops("text").forward - layers * attention == counted_by_torch(
        build_host("text").eval(), torch.zeros(1, t, dtype=torch.long)
    )
    seed = build_seed(Blueprint.ATTENTION, c, Topology.TRANSFORMER)
    assert seed_flops(Blueprint.ATTENTION, Topology.TRANSFORMER, (t, c)) - attention == counted_by_torch(
        seed, torch.zeros(1, t, c)
    )


def test_epoch_flops_count_trained_seeds_three_times_and_share_the_validation_prefix():
    def model_with_seed_in(stage: Stage) -> MorphogeneticModel:
        model = MorphogeneticModel(build_host("digits-impaired"), ["r0c1", "r0c2"], LifecycleConfig(auto_forward=False))
        drive_to(model.slot("r0c1"), stage, "conv_heavy")
        return model

    counter = FlopCounter("digits-impaired", {"r0c1": (4, 4, 4), "r0c2": (8, 2, 2)})
    rows = 100
    germinated = model_with_seed_in(Stage.GERMINATED)
    assert counter.train_epoch(germinated.seed_slots(), rows) == (rows * 3 * HOST_HAND, 0)  # not run yet
    model = model_with_seed_in(Stage.HOLDING)
    slot = model.slot("r0c1")
    assert counter.train_epoch(model.seed_slots(), rows) == (
        rows * 3 * (HOST_HAND + CONV_HEAVY_HAND),
        rows * 3 * CONV_HEAVY_HAND,
    )
    plan = build_plan(model)  # main, off:r0c1
    assert plan.names == ("main", "off:r0c1")
    main, extra = counter.validation(model.seed_slots(), plan.alphas, rows)
    assert main == rows * (HOST_HAND + CONV_HEAVY_HAND)
    # blocks 0-1 and r0c1's seed run once; after r0c1 (block 2, the head) once more for the second configuration
    assert extra == rows * 1 * (HOST_HAND - BEFORE_R0C1)
    slot.prune(force=True)  # freed: nothing of it runs any more
    assert counter.validation(model.seed_slots(), build_plan(model).alphas, rows) == (rows * HOST_HAND, 0)
