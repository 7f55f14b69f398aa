"""Per-host seconds of one training epoch of N digits-impaired hosts, stacked (issue 77) against one after another.

    OMP_NUM_THREADS=1 python benchmarks/stacked_hosts.py [--sizes 1 4 8 16] [--rounds 7]

Each host trains on a 540- or 539-sample shard (shard i % 2 of 2, the CNN A/Bs' setting: 9 batches of 64), with the
env's optimizer (SGD, momentum 0.9, weight decay 5e-4) and gradient clipping, on one torch thread. For each N:
- `separate`: N hosts one after another, each through env/epoch.py's train_epoch (the project's CPU step);
- `stacked`: the N hosts as one StackedCNNHosts (morpho/stacked.py: 1x1 convolutions as a batched matrix product),
  one env/stacked_step.py epoch;
- `grouped`: the same with the 1x1 convolutions as one grouped convolution (groups=N);
- `vmap`: the same step with the forward as torch.func.vmap over functional_call of a CNNHost.
The variants run alternately, in a rotating order, `--rounds` times after one warm-up round; a figure is the median
over rounds of an epoch's seconds divided by N. Prints the machine (CPU, cores, torch, commit), then one JSON line per
N with `separate_over`, each variant's speed-up over `separate` measured in the same rounds. About 15 s on one core.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import commit  # noqa: E402

from esper_ray.data.datasets import load_digits  # noqa: E402
from esper_ray.data.sharding import DeviceShard, shard_indices  # noqa: E402
from esper_ray.env.epoch import train_epoch  # noqa: E402
from esper_ray.env.morphogenetic_env import HOST_MOMENTUM, HOST_WEIGHT_DECAY  # noqa: E402
from esper_ray.env.stacked_step import StackedSGD, StackedTrainStep, train_stacked_epoch  # noqa: E402
from esper_ray.env.train_step import Precision  # noqa: E402
from esper_ray.morpho import stacked as stacked_module  # noqa: E402
from esper_ray.morpho.host import CNNHost, host_preset  # noqa: E402
from esper_ray.morpho.model import MorphogeneticModel  # noqa: E402
from esper_ray.morpho.stacked import Rows, StackedCNNHosts  # noqa: E402

LR, BATCH, MAX_GRAD_NORM = 0.05, 64, 1.0  # digits-impaired's host_lr and batch, the env's max_grad_norm


class VmapHosts(StackedCNNHosts):
    """The stacked hosts with torch.func's forward: vmap over functional_call of one CNNHost (on the meta device),
    the running statistics updated in place through the stacked buffers."""

    def __init__(self, hosts: list[CNNHost]) -> None:
        super().__init__(hosts)
        self.base = copy.deepcopy(hosts[0]).to("meta")

    def forward(self, x, at_slot=None, hooked=None, rows: Rows = None):  # type: ignore[no-untyped-def]
        params = self.params if rows is None else {k: v[rows] for k, v in self.params.items()}
        buffers = self.buffers if rows is None else {k: v[rows] for k, v in self.buffers.items()}
        self.base.train(self.training)
        logits = torch.func.vmap(lambda p, b, xi: functional_call(self.base, (p, b), (xi,)))(params, buffers, x)
        if rows is not None and self.training:
            for k, v in buffers.items():
                self.buffers[k].index_copy_(0, rows, v)
        return logits


def machine() -> dict[str, object]:
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "card": "no GPU",
        "cpu": model,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "commit": commit(),
        "load_average": os.getloadavg(),
    }


def measure(n: int, data, shards: list[DeviceShard], rounds: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Per-host seconds of an epoch of each variant for N hosts: the median over rounds."""
    hosts = []
    for seed in range(n):
        torch.manual_seed(seed)
        hosts.append(CNNHost(host_preset("digits-impaired")))
    host_shards = [shards[i % 2] for i in range(n)]
    epochs = {"separate": 0}

    models = [MorphogeneticModel(copy.deepcopy(h), ["r0c1"]) for h in hosts]
    optimizers = [
        torch.optim.SGD(m.host.parameters(), lr=LR, momentum=HOST_MOMENTUM, weight_decay=HOST_WEIGHT_DECAY, fused=True)
        for m in models
    ]

    def separate() -> None:
        for i, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
            g = torch.Generator().manual_seed(epochs["separate"] * 1000 + i)
            train_epoch(
                model,
                optimizer,
                host_shards[i],
                batch_size=BATCH,
                generator=g,
                prepare=data.prepare,
                precision=Precision(),
                max_grad_norm=MAX_GRAD_NORM,
            )
        epochs["separate"] += 1

    def stacked_variant(cls: type[StackedCNNHosts], pointwise_as_product: bool) -> Callable[[], None]:
        module = cls(hosts)
        sgd = StackedSGD(module.parameters(), lr=LR, momentum=HOST_MOMENTUM, weight_decay=HOST_WEIGHT_DECAY)
        step = StackedTrainStep(module, sgd, MAX_GRAD_NORM)
        done = [0]

        def run() -> None:
            stacked_module.POINTWISE_AS_PRODUCT = pointwise_as_product
            try:
                generators = [torch.Generator().manual_seed(done[0] * 1000 + i) for i in range(n)]
                train_stacked_epoch(step, host_shards, generators, [data.prepare] * n, batch_size=BATCH)
            finally:
                stacked_module.POINTWISE_AS_PRODUCT = True
            done[0] += 1

        return run

    variants: dict[str, Callable[[], None]] = {
        "separate": separate,
        "stacked": stacked_variant(StackedCNNHosts, True),
        "grouped": stacked_variant(StackedCNNHosts, False),
        "vmap": stacked_variant(VmapHosts, True),
    }
    names = list(variants)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds + 1):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            start = time.perf_counter()
            variants[name]()
            if r > 0:  # round 0 warms up (allocator, oneDNN's primitives)
                seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) / n for name, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    where = machine()
    print(json.dumps({"machine": where}), flush=True)
    data = load_digits()
    cpu = torch.device("cpu")
    shards = []
    for k in range(2):
        idx = shard_indices(len(data.train_y), k, 2)
        shards.append(DeviceShard(data.train_x[idx], data.train_y[idx], cpu))

    for n in args.sizes:
        per_host = measure(n, data, shards, args.rounds)
        print(
            json.dumps(
                {
                    "hosts": n,
                    "per_host_epoch_ms": {k: round(1000 * v, 3) for k, v in per_host.items()},
                    "separate_over": {
                        k: round(per_host["separate"] / v, 2) for k, v in per_host.items() if k != "separate"
                    },
                    "rounds": args.rounds,
                    "card": where["card"],
                    "commit": where["commit"],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
