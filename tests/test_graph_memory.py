"""An env's CUDA graphs share one memory pool (env/graph_memory.py): they train and validate what eager steps do
while re-captured through an episode, the pool does not pile up over episodes, and no cycle collection frees a
dropped graph in the middle of a capture. CUDA only (gpu_check.sh runs it);
the captured steps' bookkeeping is tested on the CPU in test_train_step.py and test_validation_graph.py."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from esper_ray.contracts.actions import Blueprint, Op, encode_joint
from esper_ray.env import MorphogeneticEnv
from esper_ray.env.graph_memory import GraphMemory, capturing
from esper_ray.policy.baselines import wait_action

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs need a GPU (benchmarks/gpu_check.sh runs this)"
)

DIGITS = {
    "task": "digits",
    "max_epochs": 8,
    "num_shards": 2,
    "device": "cuda",
    "batch_size": 48,
    "min_training_epochs": 1,
}


def episode(env: MorphogeneticEnv, seed: int) -> list[float]:
    """A conv_light seed germinated at epoch 1 (the step and the pass captured again as it trains and blends) and
    pruned before epoch 6 (the host alone's kept graphs replayed again), then every epoch's train and validation
    loss."""
    env.reset(seed=seed)
    losses = []
    for epoch in range(8):
        action = wait_action()
        if epoch == 1:
            action[0], action[1] = encode_joint(Op.GERMINATE, 1), int(Blueprint.CONV_LIGHT)
        if epoch == 6:
            env.model.slot("r0c1").prune(force=True)
        _, _, _, _, info = env.step(action)
        losses += [info["train_loss"], info["val_loss"]]
    return losses


def test_kept_graphs_sharing_the_envs_pool_train_and_validate_what_eager_steps_do():
    """Two episodes: graphs captured as the seed comes and goes, the host alone's kept ones replayed after the prune
    and through the second episode, all in one pool, against eager steps."""
    eager_env = MorphogeneticEnv({**DIGITS, "cuda_graphs": False})
    eager = episode(eager_env, seed=4) + episode(eager_env, seed=5)
    env = MorphogeneticEnv(DIGITS)
    graphed = episode(env, seed=4)
    first = (env.graphs.captures, env.val_graphs.captures)
    assert first[0] >= 4 and first[1] >= 2, first  # the host alone's full and last batch, the seed's; their passes
    env.reset(seed=5)
    env.step(wait_action())
    assert (env.graphs.captures, env.val_graphs.captures) == first  # the host alone's graphs were kept
    graphed += episode(env, seed=5)
    pool = env.graphs.captured.graph.pool()
    assert env.val_graphs.captured.graph.pool() == pool  # one pool for the step and the pass
    np.testing.assert_allclose(graphed, eager, rtol=2e-3, atol=1e-4)


def test_the_pool_does_not_pile_up_over_episodes():
    """Each re-capture reuses the blocks of the graphs dropped before it: after the first episode the memory the
    process holds stays put (torch.cuda.graph's private pools, kept without its empty_cache, grew by every capture)."""
    env = MorphogeneticEnv(DIGITS)
    episode(env, seed=0)
    torch.cuda.synchronize()
    after_one = torch.cuda.memory_reserved()
    captures = env.graphs.captures + env.val_graphs.captures
    for seed in (1, 2, 3):
        episode(env, seed)
    torch.cuda.synchronize()
    assert env.graphs.captures + env.val_graphs.captures >= captures + 3 * 4  # each episode captured its seed anew
    assert torch.cuda.memory_reserved() <= after_one + 32 * 2**20


@pytest.mark.parametrize("shared", [True, False], ids=["shared pool", "private pools"])
def test_the_cycle_collector_never_frees_a_dropped_graph_during_a_capture(shared):
    """A dropped graph that a reference cycle holds is freed whenever the cycle collector next runs; freed during a
    capture, it invalidates that capture (an earlier test's env did so on an H200: "operation not permitted when
    stream is capturing (function reset)"). Here such a cycle becomes garbage as a capture starts and the capture
    allocates enough Python objects to trigger the collector many times over: no collection starts while capturing,
    the capture replays what it recorded, and the cycle is freed once the capture is over."""
    device = torch.device("cuda")
    memory = GraphMemory(device) if shared else None
    x = torch.arange(4.0, device=device)
    collections_while_capturing = []
    freed = []

    class GraphInACycle:
        def __init__(self) -> None:
            self.me, self.graph = self, torch.cuda.CUDAGraph()
            with capturing(self.graph, memory):
                self.out = x * 2
            self.graph.replay()  # instantiated and used, as an env's graphs are

        def __del__(self) -> None:
            freed.append(True)

    def on_collection(phase: str, info: dict) -> None:
        if phase == "start":
            collections_while_capturing.append(torch.cuda.is_current_stream_capturing())

    gc.collect()
    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    gc.callbacks.append(on_collection)
    try:
        cycle = GraphInACycle()
        graph = torch.cuda.CUDAGraph()
        with capturing(graph, memory):
            del cycle  # garbage from here on
            kept = [[i] for i in range(20_000)]  # net allocations: the collector's trigger
            out = x + 1
        assert gc.isenabled() and len(kept) == 20_000
        assert not any(collections_while_capturing)
        gc.collect()
    finally:
        gc.callbacks.remove(on_collection)
        gc.set_threshold(*threshold)
    assert freed == [True]
    x.add_(1)
    graph.replay()
    assert torch.equal(out, x + 1)
