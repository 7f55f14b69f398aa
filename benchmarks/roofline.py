"""Roofline of an env step on the cifar10 host: FLOPs and bytes per sample, the card's limits, the fraction reached.

    python benchmarks/roofline.py                                            # per-sample figures (any machine)
    python benchmarks/roofline.py --card H200 --samples-per-s 508414 --precision fp32
    python benchmarks/roofline.py --from benchmarks/results/throughput_h100x2_2026-11-26c.jsonl --line 1
    python benchmarks/roofline.py --measure --samples-per-s 508414          # on a CUDA card: its measured limits too

The host is the default preset of tasks cifar10 and synthetic (what `benchmarks/throughput.py --gpu` trains) with
no seed: a seed adds FLOPs, bytes and counterfactual configurations, which this leaves out.

A step (per env, as throughput.py runs it) trains one epoch over T = 12,500 samples in batches of 512, then runs
one fused validation pass over V = 10,000 samples for K configurations (K = 1 with no seed: `main` alone). Figures
per *training* sample charge the step's validation to the samples it trained:
    per training sample = training + (V x K / T) x validation
so a measured training samples/s (what throughput.py reports) times these gives the step's FLOP/s and bytes/s,
validation included. The reset's validation pass (one per 20-epoch episode) is left out.

FLOPs come from esper_ray/morpho/flops.py (convolutions and the linear head; training is TRAIN_FACTOR = 3
forwards). Bytes are estimated from the same layers' shapes, with forward hooks on a meta-device copy:
    forward    each conv/linear reads its input and writes its output once: (in + out) elements per sample
    backward   2x forward: the input-gradient kernel reads the output's gradient and writes the input's, the
               weight-gradient kernel reads the saved input and the output's gradient
    weights    per training step, 11 passes over the parameters at fp32 (forward and backward read them, backward
               writes their gradients, clipping reads them twice and writes them once, SGD with momentum reads
               weights, gradients and momenta and writes weights and momenta), shared by the batch's 512 samples;
               per validation chunk (1,024 samples) one read. Under 1 % of the total.
Like flops.py, this leaves out norms, ReLUs, pooling, the loss and the input's conversion: their traffic is real
(eager kernels, unfused), so the bytes here are a lower bound and so is the fraction of bandwidth. Both FLOPs and
bytes count the first convolution's input gradient, which autograd skips (about 9 % of the training FLOPs).
Activations take 4 bytes in fp32 and 2 under bf16 autocast (`--env amp=bf16`). In fp32 cuDNN runs the
convolutions on TF32 tensor cores (torch.backends.cudnn.allow_tf32, on by default), so fp32's compute peak is
TF32's; the line gives the FP32 non-tensor fraction too. The roof is min(peak, intensity x bandwidth).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from throughput import machine  # benchmarks/ is on sys.path when this runs as a script
from torch import nn

from esper_ray.contracts.env_config import TASK_DEFAULTS
from esper_ray.morpho.flops import TRAIN_FACTOR, host_flops
from esper_ray.morpho.host import HOST_PRESETS
from esper_ray.morpho.hosts import build_host

COUNTED = (nn.Conv2d, nn.Linear)
"""The layers flops.py counts in a CNN host."""
WEIGHT_PASSES_TRAIN = 11
WEIGHT_PASSES_VAL = 1
VAL_CHUNK = TASK_DEFAULTS["cifar10"]["val_batch_size"]
"""The cifar10 task's validation chunk (the weights are read once a chunk)."""
ELEMENT_BYTES = {"fp32": 4, "bf16": 2}
PEAK_OF = {"fp32": "tf32", "bf16": "bf16"}
"""Which compute peak a precision's convolutions run at."""


@dataclass(frozen=True)
class Limits:
    fp32: float
    """FLOP/s on the CUDA cores (no tensor cores)."""
    tf32: float
    """FLOP/s on tensor cores, fp32 storage."""
    bf16: float
    """FLOP/s on tensor cores, bf16."""
    bandwidth: float
    """Bytes/s of device memory."""


# Published dense peaks, SXM columns of NVIDIA's datasheets: "NVIDIA H100 Tensor Core GPU" and "NVIDIA H200 Tensor
# Core GPU" (https://www.nvidia.com/en-us/data-center/h100/ and .../h200/): FP32 67 TFLOPS; TF32 989 and BF16 1,979
# TFLOPS "with sparsity", halved here to dense; GPU memory bandwidth 3.35 and 4.8 TB/s.
CARDS = {
    "H100-SXM": Limits(fp32=67e12, tf32=494.5e12, bf16=989.5e12, bandwidth=3.35e12),
    "H200": Limits(fp32=67e12, tf32=494.5e12, bf16=989.5e12, bandwidth=4.8e12),
}


def card_key(device_name: str) -> str | None:
    """The CARDS entry of a device name as torch.cuda.get_device_name gives it ("NVIDIA H100 80GB HBM3")."""
    if device_name in CARDS:
        return device_name
    if "H200" in device_name and "NVL" not in device_name:  # the H200 NVL (PCIe) has lower peaks
        return "H200"
    if "H100" in device_name and ("HBM3" in device_name or "SXM" in device_name):
        return "H100-SXM"
    return None


def layer_elements(preset: str) -> tuple[int, int]:
    """(activation elements in + out of the counted layers, parameters) per sample of a host, from its shapes."""
    with torch.device("meta"):
        host = build_host(preset)
    tally = [0]

    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        tally[0] += inputs[0].numel() + output.numel()

    handles = [m.register_forward_hook(hook) for m in host.modules() if isinstance(m, COUNTED)]
    row = torch.zeros(1, host.cfg.in_channels, host.cfg.image_size, host.cfg.image_size, device="meta")
    try:
        with torch.no_grad():
            host(row)
    finally:
        for h in handles:
            h.remove()
    return tally[0], sum(p.numel() for p in host.parameters())


def per_sample(preset: str, *, train: int, val: int, configs: int, batch: int) -> dict[str, Any]:
    """FLOPs per sample and, per precision, bytes per sample and intensity of one step (module docstring)."""
    forward = host_flops(preset).forward
    elements, parameters = layer_elements(preset)
    val_share = val * configs / train  # validation samples per training sample
    figures: dict[str, Any] = {
        "forward_flops": forward,
        "train_flops": TRAIN_FACTOR * forward,
        "val_flops": forward,
        "val_per_train_sample": val_share,
        "step_flops": TRAIN_FACTOR * forward + val_share * forward,
        "activation_elements": elements,
        "parameters": parameters,
        "precisions": {},
    }
    for name, size in ELEMENT_BYTES.items():
        train_bytes = TRAIN_FACTOR * elements * size + WEIGHT_PASSES_TRAIN * parameters * 4 / batch
        val_bytes = elements * size + WEIGHT_PASSES_VAL * parameters * 4 / VAL_CHUNK
        step_bytes = train_bytes + val_share * val_bytes
        figures["precisions"][name] = {
            "forward_activation_bytes": elements * size,
            "train_bytes": train_bytes,
            "val_bytes": val_bytes,
            "step_bytes": step_bytes,
            "intensity": figures["step_flops"] / step_bytes,
        }
    return figures


def measure_limits() -> Limits:
    """This card's own limits: an 8192^3 matmul per precision, a 1 GiB device-to-device copy (read + write)."""
    if not torch.cuda.is_available():
        raise SystemExit("--measure needs a CUDA card and this machine has none; leave --measure out, or pass --card")

    def seconds(fn: Any, repeats: int = 20) -> float:
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / repeats

    n, saved = 8192, torch.backends.cuda.matmul.allow_tf32
    rates = {}
    kinds = (("fp32", torch.float32, False), ("tf32", torch.float32, True), ("bf16", torch.bfloat16, False))
    for name, dtype, tf32 in kinds:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a, b = torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)
        rates[name] = 2 * n**3 / seconds(lambda a=a, b=b: a @ b)
    torch.backends.cuda.matmul.allow_tf32 = saved
    x = torch.empty(2**28, device="cuda")
    y = torch.empty_like(x)
    return Limits(**rates, bandwidth=2 * x.numel() * x.element_size() / seconds(lambda: y.copy_(x)))


def roofline(
    precision: str, intensity: float, limits: Limits, rate: float | None, step_flops: float, step_bytes: float
) -> dict[str, Any]:
    """The roof at this intensity and, given training samples/s, the FLOP/s and bytes/s reached and their fractions."""
    peak = getattr(limits, PEAK_OF[precision])
    roof = min(peak, intensity * limits.bandwidth)
    out: dict[str, Any] = {
        "peak": peak,
        "ridge": peak / limits.bandwidth,
        "roof": roof,
        "bound": "compute" if roof == peak else "bandwidth",
    }
    if rate is not None:
        flops, traffic = rate * step_flops, rate * step_bytes
        out.update(
            flop_per_s=flops,
            bytes_per_s=traffic,
            fraction_of_roof=flops / roof,
            fraction_of_peak=flops / peak,
            fraction_of_bandwidth=traffic / limits.bandwidth,
        )
        if precision == "fp32":
            out["fraction_of_fp32_cuda_cores"] = flops / limits.fp32
    return out


def describe(precision: str, p: dict[str, Any], card: str, rate: float | None) -> str:
    """One human line of a precision's figures."""
    line = (
        f"{precision}: {p['step_bytes'] / 1e3:.1f} kB per training sample (forward activations "
        f"{p['forward_activation_bytes'] / 1e3:.1f} kB/sample), intensity {p['intensity']:.1f} FLOP/B"
    )
    if "roof" not in p:
        return line
    line += f"; {card} roof {p['roof'] / 1e12:.1f} TFLOP/s ({p['bound']}-bound, ridge {p['ridge']:.0f} FLOP/B)"
    if rate is None:
        return line
    line += (
        f"; at {rate:,.0f} samples/s {p['flop_per_s'] / 1e12:.2f} TFLOP/s and {p['bytes_per_s'] / 1e9:.0f} GB/s: "
        f"{100 * p['fraction_of_roof']:.1f} % of the roof, {100 * p['fraction_of_peak']:.2f} % of "
        f"{PEAK_OF[precision].upper()}'s {p['peak'] / 1e12:.1f} TFLOP/s"
    )
    if "fraction_of_fp32_cuda_cores" in p:
        line += f" ({100 * p['fraction_of_fp32_cuda_cores']:.1f} % of FP32's without tensor cores)"
    return line + f", {100 * p['fraction_of_bandwidth']:.1f} % of the bandwidth"


def read_result(path: Path, line: int | None) -> dict[str, Any]:
    """Training samples/s per GPU, card, precision and step sizes of one line of a benchmarks/results file."""
    try:
        lines = [json.loads(text) for text in path.read_text().splitlines() if text.strip()]
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path} is not JSON lines ({e}); --from reads throughput.py's .json/.jsonl files") from None
    if line is not None and not 1 <= line <= len(lines):
        raise SystemExit(f"--line {line}: {path} has lines 1 to {len(lines)}")
    record = lines[-1 if line is None else line - 1]
    runs = [record[k] for k in ("with_mps", "without_mps") if record.get(k, {}).get("train_samples_per_s")]
    if not runs:
        raise SystemExit(
            f"{path} line {line or len(lines)} holds no train_samples_per_s (keys: {sorted(record)}); "
            f"pick a line of `esper-ray train` figures with --line (1 to {len(lines)})"
        )
    setup = record["setup"]
    amp = dict(map(tuple, setup.get("extra_env", []))).get(
        "amp", "off"
    )  # files from before amp=auto: fp32 unless named
    return {
        "samples_per_s": runs[0]["train_samples_per_s"] / setup["gpus"],
        "card": record["machine"]["card"],
        "precision": setup.get("precision") or ("bf16" if amp == "bf16" else "fp32"),
        "train": setup["train_size"] // setup["envs"],
        "val": setup.get("val_size") or setup["train_size"] // 5,  # synthetic_held_out's default then
        "half": "with_mps" if runs[0] is record.get("with_mps") else "without_mps",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--host", default="cifar10", choices=sorted(HOST_PRESETS), help="CNN host preset (default cifar10)"
    )
    parser.add_argument(
        "--train-size", type=int, default=12_500, help="training samples of one env's step, T (--from's file sets it)"
    )
    parser.add_argument(
        "--val-size", type=int, default=10_000, help="validation samples of one env's step, V (--from's file sets it)"
    )
    parser.add_argument(
        "--configs",
        type=int,
        default=1,
        help="fused validation configurations, K (1 with no seed; each counted as a whole forward)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=512, help="training batch, over which weight traffic is shared"
    )
    parser.add_argument("--precision", choices=("fp32", "bf16", "all"), default="all", help="precision(s) to print")
    parser.add_argument("--samples-per-s", type=float, help="measured training samples/s of one card (needs a card)")
    parser.add_argument(
        "--from",
        dest="from_file",
        type=Path,
        help="a benchmarks/results throughput file: takes its "
        "train samples/s per GPU (with MPS when both), card, precision and step sizes",
    )
    parser.add_argument("--line", type=int, help="which line of --from's file, from 1 (default: the last)")
    parser.add_argument(
        "--card", choices=sorted(CARDS), help="published peaks to use (default: the file's card, or this machine's)"
    )
    parser.add_argument("--measure", action="store_true", help="also measure this CUDA card's limits and use them")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()

    source = read_result(args.from_file, args.line) if args.from_file else {}
    rate = args.samples_per_s if args.samples_per_s is not None else source.get("samples_per_s")
    precisions = (
        [source["precision"]]
        if source and args.precision == "all"
        else (list(ELEMENT_BYTES) if args.precision == "all" else [args.precision])
    )
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    card = args.card or card_key(source.get("card") or device)
    if rate is not None and card is None and not args.measure:
        raise SystemExit(
            f"samples/s given, but no card with published peaks ({source.get('card') or device}): pass "
            f"--card ({' or '.join(CARDS)}), or --measure on the card"
        )
    limits = measure_limits() if args.measure else CARDS[card] if card else None
    train, val = source.get("train", args.train_size), source.get("val", args.val_size)
    figures = per_sample(args.host, train=train, val=val, configs=args.configs, batch=args.batch_size)

    here = machine()
    print(
        f"machine: {here['host']}, {here['cpus']} CPUs, torch {here['torch']}, {here['card']}, commit {here['commit']}"
    )
    if source:
        print(
            f"from {args.from_file}: {source['card']}, {source['precision']}, {source['half']}, "
            f"{rate:,.0f} training samples/s per GPU, T {train:,}, V {val:,}"
        )
    print(
        f"{args.host} host, no seed: forward {figures['forward_flops'] / 1e6:.3f} MFLOP/sample, training "
        f"{figures['train_flops'] / 1e6:.3f} (x{TRAIN_FACTOR}), validation {figures['val_per_train_sample']:.2f} "
        f"samples per training sample (V {val:,} x K {args.configs} / T {train:,}): "
        f"{figures['step_flops'] / 1e6:.3f} MFLOP per training sample"
    )
    report: dict[str, Any] = {
        "machine": here,
        "host": args.host,
        "seed": None,
        "train_size": train,
        "val_size": val,
        "configs": args.configs,
        "batch_size": args.batch_size,
        **figures,
        "card": card,
        "limits": asdict(limits) if limits else None,
        "limits_source": "measured" if args.measure else "published" if card else None,
        "samples_per_s": rate,
    }
    if args.measure:
        print(
            "measured: "
            + ", ".join(
                f"{k} {v / 1e12:.1f} T{'B' if k == 'bandwidth' else 'FLOP'}/s" for k, v in asdict(limits).items()
            )
            + f" (convolutions in fp32 on TF32: torch.backends.cudnn.allow_tf32={torch.backends.cudnn.allow_tf32})"
        )
    for name in precisions:
        p = figures["precisions"][name]
        if limits:
            p.update(roofline(name, p["intensity"], limits, rate, figures["step_flops"], p["step_bytes"]))
        print(describe(name, p, f"{device} (measured)" if args.measure else str(card), rate))
    report["precisions"] = {k: v for k, v in figures["precisions"].items() if k in precisions}
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
