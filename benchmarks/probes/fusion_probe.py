"""What fusing the host's layers saves in the captured train step: the measurements behind
esper_ray/morpho/fused_block.py.

    python benchmarks/probes/fusion_probe.py                     # one process, every variant, fp32 and bf16
    python benchmarks/probes/fusion_probe.py --procs 4 --variants env,unfused  # 4 processes at once (start MPS first)

Each variant trains the cifar10 host (slot r0c1 dormant, batch 512, the env's SGD settings) with the env's own
TrainStep, captured as a CUDA graph as train_step.py does, and times 200 replays with CUDA events: the GPU time
of one training step, per sample. Variants change how the host's forward (and so its backward) is computed:

  env           the env's step as it is (compiled blocks: fused_block.py; fused SGD)
  unfused       the step before fused_block.py: cuDNN batch norm, ATen ReLU and max-pool, foreach SGD
  blocks        (hand-patched, on the unfused step) each block's conv -> batch norm -> ReLU through torch.compile
                (Triton kernels around cuDNN's convolution), max-pool eager
  blocks_pool   the same with the block's 2x2 max-pool inside the compiled function
  whole         the whole host forward through torch.compile
  whole_tuned   the same with mode="max-autotune-no-cudagraphs" (Triton convolution templates compete with cuDNN)
  blocks_pool_pad4  blocks_pool with the first convolution's 3 input channels padded with zeros to 4
  fused_sgd     unfused with torch.optim.SGD(fused=True)
  val_eager     the captured validation pass (10,000 samples, one chunk) as it is: batch norm folded, cuDNN's
                convolution + bias + ReLU (the image's block in fp32), ATen's max-pool
  val_compiled  the same with each block's folded convolution, ReLU and pool through torch.compile
  val_pad4      val_compiled with the first convolution's input padded to 4 channels

With --procs N, N processes replay their own step at once for --seconds and the line gives the summed samples/s.
With --profile, the ten costliest kernels of each variant go to the JSON too. Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from esper_ray.morpho import fused_block

VARIANTS = (
    "env",
    "unfused",
    "blocks",
    "blocks_pool",
    "blocks_pool_pad4",
    "whole",
    "whole_tuned",
    "fused_sgd",
    "val_eager",
    "val_compiled",
    "val_pad4",
)


def conv_bn_relu(
    x: torch.Tensor,
    weight: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    mean: torch.Tensor,
    var: torch.Tensor,
    padding: int,
    pool: bool,
    pad_in: int = 0,
) -> torch.Tensor:
    if pad_in:  # zero input channels with zero weights: the same output, a convolution with 4 input channels
        x, weight = F.pad(x, (0, 0, 0, 0, 0, pad_in)), F.pad(weight, (0, 0, 0, 0, 0, pad_in))
    y = F.conv2d(x, weight, None, 1, padding)
    y = torch.relu(F.batch_norm(y, mean, var, gamma, beta, True, 0.1, 1e-5))
    return F.max_pool2d(y, 2) if pool else y


def conv_relu_pool(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, padding: int, pool: bool, pad_in: int = 0
) -> torch.Tensor:
    """Eval: batch norm folded into weight and bias (ConvBlock.folded)."""
    if pad_in:
        x, weight = F.pad(x, (0, 0, 0, 0, 0, pad_in)), F.pad(weight, (0, 0, 0, 0, 0, pad_in))
    y = torch.relu(F.conv2d(x, weight, bias, 1, padding))
    return F.max_pool2d(y, 2) if pool else y


def _pad_in(block: Any, variant: str) -> int:
    channels = block.conv.in_channels
    return (4 - channels % 4) % 4 if variant.endswith("pad4") else 0


def patch_host(model: Any, variant: str) -> None:
    host = model.host
    if variant in ("blocks", "blocks_pool", "blocks_pool_pad4"):
        fused = torch.compile(conv_bn_relu, dynamic=False)
        fuse_pool = variant != "blocks"

        def forward(self: Any, x: torch.Tensor, at_slot: Any = None, hooked: Any = None) -> torch.Tensor:
            for i, block in enumerate(self.blocks):
                pool = i < self.cfg.pool_layers
                x = fused(
                    x,
                    block.conv.weight,
                    block.norm.weight,
                    block.norm.bias,
                    block.norm.running_mean,
                    block.norm.running_var,
                    block.conv.padding[0],
                    pool and fuse_pool,
                    _pad_in(block, variant),
                )
                if pool and not fuse_pool:
                    x = F.max_pool2d(x, 2)
            return self.head(x.mean(dim=(2, 3)))

        host.forward = types.MethodType(forward, host)
    elif variant in ("val_compiled", "val_pad4"):
        fused = torch.compile(conv_relu_pool, dynamic=False)

        def forward(self: Any, x: torch.Tensor, at_slot: Any = None, hooked: Any = None) -> torch.Tensor:
            for i, block in enumerate(self.blocks):
                weight, bias = block.folded()
                x = fused(x, weight, bias, block.conv.padding[0], i < self.cfg.pool_layers, _pad_in(block, variant))
            return self.head(x.mean(dim=(2, 3)))

        host.forward = types.MethodType(forward, host)
    elif variant in ("whole", "whole_tuned"):
        mode = "max-autotune-no-cudagraphs" if variant == "whole_tuned" else None
        plain = host.forward
        compiled = torch.compile(lambda x: plain(x), dynamic=False, mode=mode)  # slots dormant: no hook to trace
        host.forward = lambda x, at_slot=None, hooked=None: compiled(x)


def build(variant: str, amp: str, device: torch.device) -> tuple[Any, torch.Tensor, torch.Tensor]:
    from esper_ray.contracts.env_config import TASK_DEFAULTS
    from esper_ray.env.morphogenetic_env import HOST_MOMENTUM, HOST_WEIGHT_DECAY
    from esper_ray.env.train_step import Precision, StepGraphs, TrainStep
    from esper_ray.morpho.hosts import build_host
    from esper_ray.morpho.model import MorphogeneticModel

    model = MorphogeneticModel(build_host("cifar10"), ["r0c1"]).to(device).to(memory_format=torch.channels_last)
    model.train()
    patch_host(model, variant)
    fused_block.ENABLED = variant == "env"  # the hand-patched variants replace the host's forward
    optimizer = torch.optim.SGD(
        model.host.parameters(),
        lr=TASK_DEFAULTS["synthetic"]["host_lr"],
        momentum=HOST_MOMENTUM,
        weight_decay=HOST_WEIGHT_DECAY,
        fused=variant in ("env", "fused_sgd"),
    )
    precision = Precision(dtype=torch.bfloat16) if amp == "bf16" else Precision()
    graphs = StepGraphs(enabled=True)
    step = TrainStep(model, optimizer, precision, 1.0, graphs.accumulators(device))
    x = torch.rand(512, 3, 32, 32, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (512,), device=device)
    for _ in range(4):  # eager warm-up (optimizer state, compile), the capture, replays
        graphs.run(step, x, y)
    torch.cuda.synchronize()
    return graphs.captured, x, y


def build_validation(variant: str, amp: str, device: torch.device) -> Any:
    """The captured validation pass (validation_graph.py) of 10,000 samples in one chunk, slot r0c1 dormant."""
    from esper_ray.env.epoch import validate_fused
    from esper_ray.env.train_step import Precision
    from esper_ray.env.validation_graph import CapturedValidation, validation_key
    from esper_ray.morpho.hosts import build_host
    from esper_ray.morpho.model import MorphogeneticModel

    model = MorphogeneticModel(build_host("cifar10"), ["r0c1"]).to(device).to(memory_format=torch.channels_last)
    model.eval()
    patch_host(model, variant)
    precision = Precision(dtype=torch.bfloat16) if amp == "bf16" else Precision()
    x = torch.rand(10_000, 3, 32, 32, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (10_000,), device=device)
    alphas = torch.zeros(1, 1)
    for _ in range(2):
        validate_fused(model, x, y, alphas, chunk=10_000, prepare=lambda v: v, precision=precision)
    captured = CapturedValidation(
        validation_key(model, alphas, precision, 10_000),
        model,
        x,
        y,
        alphas,
        chunk=10_000,
        prepare=lambda v: v,
        precision=precision,
    )
    torch.cuda.synchronize()
    return captured


def gpu_us(launch: Callable[[], None], n: int) -> float:
    """GPU microseconds a call of `launch` (CUDA events around n calls on the current stream)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        launch()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / n


def time_validation(captured: Any, n: int = 50) -> float:
    """GPU microseconds per validation sample of the captured pass."""
    return gpu_us(captured._launch, n) / len(captured.y)


def time_replays(captured: Any, x: torch.Tensor, y: torch.Tensor, n: int = 200) -> float:
    """GPU microseconds per training sample of the captured step."""
    return gpu_us(lambda: captured.replay(x, y), n) / len(y)


def top_kernels(captured: Any, x: torch.Tensor, y: torch.Tensor, k: int = 10) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            captured.replay(x, y)
        torch.cuda.synchronize()
    rows = [(e.key[:90], round(e.device_time_total / 10, 1)) for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[1])[:k]


def _worker(args: argparse.Namespace, variant: str, amp: str, barrier: Any, results: Any) -> None:
    torch._dynamo.config.cache_size_limit = 64
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    device = torch.device("cuda")
    with torch.cuda.stream(torch.cuda.Stream(device)):
        captured, x, y = build(variant, amp, device)
        barrier.wait()
        start, samples = time.perf_counter(), 0
        while time.perf_counter() - start < args.seconds:
            for _ in range(50):
                captured.replay(x, y)
            torch.cuda.current_stream().synchronize()
            samples += 50 * len(y)
    results.put((samples, time.perf_counter() - start))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--amp", default="fp32,bf16", help="comma-separated: fp32, bf16")
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms per shape")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    card = torch.cuda.get_device_name(0)
    report: dict[str, Any] = {
        "card": card,
        "torch": torch.__version__,
        "procs": args.procs,
        "cudnn_benchmark": args.cudnn_benchmark,
        "us_per_sample": {},
    }
    for amp in args.amp.split(","):
        for variant in args.variants.split(","):
            if variant not in VARIANTS:
                raise SystemExit(f"--variants: unknown {variant!r}; known: {', '.join(VARIANTS)}")
            name = f"{variant}_{amp}"
            began = time.perf_counter()
            if variant.startswith("val_"):
                torch._dynamo.config.cache_size_limit = 64
                captured = build_validation(variant, amp, torch.device("cuda"))
                us = min(time_validation(captured) for _ in range(3))
                report["us_per_sample"][name] = round(us, 4)
                line = f"{name:>18}: {us:.4f} us a validation sample"
            elif args.procs == 1:
                torch._dynamo.config.cache_size_limit = 64
                captured, x, y = build(variant, amp, torch.device("cuda"))
                setup_s = time.perf_counter() - began
                us = min(time_replays(captured, x, y) for _ in range(3))
                report["us_per_sample"][name] = round(us, 4)
                line = f"{name:>18}: {us:.4f} us a training sample ({1e6 / us:,.0f} samples/s), setup {setup_s:.0f} s"
                if args.profile:
                    report.setdefault("top_kernels", {})[name] = top_kernels(captured, x, y)
            else:
                context = mp.get_context("spawn")
                barrier, results = context.Barrier(args.procs), context.Queue()
                workers = [
                    context.Process(target=_worker, args=(args, variant, amp, barrier, results))
                    for _ in range(args.procs)
                ]
                for w in workers:
                    w.start()
                outcomes = [results.get(timeout=900) for _ in workers]
                for w in workers:
                    w.join()
                rate = sum(o[0] for o in outcomes) / max(o[1] for o in outcomes)
                report.setdefault("samples_per_s", {})[name] = round(rate)
                line = f"{name:>18}: {rate:,.0f} samples/s over {args.procs} processes"
            print(line, flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
