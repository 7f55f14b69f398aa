"""The host's GPU work alone (one train epoch + one validation pass, as an env step does them), in N processes.

    python benchmarks/probes/host_step.py --procs 4             # 4 processes sharing the GPU (start MPS first)
    python benchmarks/probes/host_step.py --procs 1 --layout nchw --amp bf16 --cudnn-benchmark

Each process trains the cifar10 host (slot r0c1 dormant) on its own 12,500-sample synthetic shard, batch 512,
with the env's optimizer settings, the cifar10 task's crop-and-flip augmentation (which the throughput
benchmark's synthetic task leaves out: a few kernels an epoch), and the env's own train_epoch (CUDA-graph
replays) and validate_fused (10,000 images), for `--seconds` after
warm-up. Prints one JSON line: the variant, training samples/s summed over the processes, and ms per epoch
of one process. What it leaves out of an env step (lifecycle, rewards, observation) runs on the CPU; this
shows what the GPU work of a step costs under each layout, precision and cuDNN setting.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import time
from typing import Any

import torch


def _worker(args: argparse.Namespace, rank: int, barrier: Any, results: Any) -> None:
    from esper_ray.contracts.env_config import TASK_DEFAULTS
    from esper_ray.data.augment import crop_and_flip
    from esper_ray.data.datasets import make_synthetic
    from esper_ray.data.sharding import DeviceShard
    from esper_ray.env.epoch import train_epoch, validate_fused
    from esper_ray.env.morphogenetic_env import HOST_MOMENTUM, HOST_WEIGHT_DECAY
    from esper_ray.env.train_step import Precision, StepGraphs
    from esper_ray.morpho.hosts import build_host
    from esper_ray.morpho.model import MorphogeneticModel

    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    device = torch.device(args.device)
    layout = torch.channels_last if args.layout == "nhwc" else torch.contiguous_format
    torch.manual_seed(rank)
    data = make_synthetic(12_500, held_out=10_000)  # what each env of benchmarks/throughput.py trains and validates on
    model = MorphogeneticModel(build_host("cifar10"), ["r0c1"]).to(device).to(memory_format=layout)
    optimizer = torch.optim.SGD(
        model.host.parameters(),
        lr=TASK_DEFAULTS["synthetic"]["host_lr"],
        momentum=HOST_MOMENTUM,
        weight_decay=HOST_WEIGHT_DECAY,
    )
    generator = torch.Generator(device=device).manual_seed(rank)
    precision = Precision(dtype=torch.bfloat16) if args.amp == "bf16" else Precision()
    graphs = StepGraphs(enabled=device.type == "cuda")

    def prepare_train(x: torch.Tensor) -> torch.Tensor:
        return crop_and_flip(data.prepare(x), generator).contiguous(memory_format=layout)

    with torch.cuda.stream(torch.cuda.Stream(device)) if device.type == "cuda" else contextlib.nullcontext():
        shard = DeviceShard(data.train_x, data.train_y, device)
        val_x, val_y = data.val_x.to(device), data.val_y.to(device)

        def step() -> int:
            stats = train_epoch(
                model,
                optimizer,
                shard,
                batch_size=512,
                generator=generator,
                prepare=prepare_train,
                precision=precision,
                max_grad_norm=1.0,
                graphs=graphs,
            )
            validate_fused(
                model,
                val_x,
                val_y,
                torch.zeros(1, 1),
                chunk=args.val_batch_size,
                prepare=data.prepare,
                precision=precision,
            )
            return stats.samples

        for _ in range(3):
            step()
        barrier.wait()
        start, epochs, samples = time.perf_counter(), 0, 0
        while time.perf_counter() - start < args.seconds:
            samples += step()
            epochs += 1
    results.put((epochs, samples, time.perf_counter() - start))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--layout", choices=["nhwc", "nchw"], default="nhwc")
    parser.add_argument("--amp", choices=["off", "bf16"], default="off")
    parser.add_argument("--cudnn-benchmark", action="store_true")
    parser.add_argument("--val-batch-size", type=int, default=1024)
    args = parser.parse_args()
    context = mp.get_context("spawn")
    barrier, results = context.Barrier(args.procs), context.Queue()
    workers = [context.Process(target=_worker, args=(args, k, barrier, results)) for k in range(args.procs)]
    for w in workers:
        w.start()
    outcomes = [results.get(timeout=600) for _ in workers]
    for w in workers:
        w.join()
    seconds = max(o[2] for o in outcomes)
    print(
        json.dumps(
            {
                "card": torch.cuda.get_device_name(0) if args.device != "cpu" else "no GPU",
                "procs": args.procs,
                "layout": args.layout,
                "amp": args.amp,
                "cudnn_benchmark": args.cudnn_benchmark,
                "val_batch_size": args.val_batch_size,
                "samples_per_s": round(sum(o[1] for o in outcomes) / seconds),
                "ms_per_epoch": round(1e3 * sum(o[2] / o[0] for o in outcomes) / len(outcomes), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
