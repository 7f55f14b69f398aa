"""The host's first convolution (3 -> 8 channels, 3x3, 32x32 images) computed several ways, on this GPU.

    python benchmarks/probes/first_conv.py

cuDNN runs a channels-last convolution with 3 input channels on a generic direct kernel, the costliest single
kernel of a cifar10 training step (benchmarks/probes/fusion_probe.py --profile). Each way below is captured in a
CUDA graph and timed over replays: the forward and weight gradient of a training batch of 512 (the input needs no
gradient), and the forward of a 10,000-sample validation chunk, bf16 and fp32. Prints a table and one JSON line.

  nhwc      F.conv2d on channels-last input (what the host does)
  nchw      F.conv2d on contiguous input, its output turned channels-last
  im2col    the 27 values of each pixel's 3x3x3 neighbourhood gathered into a row, times the [27, 8] weight: a
            matrix product whose [B*H*W, 8] output is channels-last as it stands
  im2col_c  im2col through torch.compile
"""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
from fusion_probe import gpu_us  # benchmarks/probes/ is on sys.path when this runs as a script


def nhwc(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.conv2d(x, w, None, 1, 1)


def nchw(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.conv2d(x.contiguous(), w.contiguous(), None, 1, 1).contiguous(memory_format=torch.channels_last)


def im2col(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    b, c, h, wd = x.shape
    xp = F.pad(x.permute(0, 2, 3, 1), (0, 0, 1, 1, 1, 1))  # [B, H+2, W+2, C]
    patches = torch.stack(
        [xp[:, i : i + h, j : j + wd, :] for i in range(3) for j in range(3)], dim=3
    )  # [B, H, W, 9, C]
    weight = w.permute(0, 2, 3, 1).reshape(w.shape[0], -1)  # [O, 9*C], (kh, kw, c) order like the patches
    out = patches.reshape(b * h * wd, -1) @ weight.t()  # [B*H*W, O]
    return out.view(b, h, wd, -1).permute(0, 3, 1, 2)  # [B, O, H, W], channels-last in memory


def timed(fn: Callable[[], None], n: int = 50) -> float:
    """Microseconds a call, replayed from a CUDA graph of one call."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return gpu_us(graph.replay, n)


def main() -> None:
    device = torch.device("cuda")
    ways = {"nhwc": nhwc, "nchw": nchw, "im2col": im2col, "im2col_c": torch.compile(im2col, dynamic=False)}
    report: dict[str, float] = {}
    for dtype in (torch.bfloat16, torch.float32):
        tag = "bf16" if dtype is torch.bfloat16 else "fp32"
        w = torch.randn(8, 3, 3, 3, device=device, requires_grad=True)
        x = torch.rand(512, 3, 32, 32, device=device).contiguous(memory_format=torch.channels_last)
        xv = torch.rand(10_000, 3, 32, 32, device=device).contiguous(memory_format=torch.channels_last)
        reference = None
        for name, way in ways.items():

            def train(
                way: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = way,
                dtype: torch.dtype = dtype,
                x: torch.Tensor = x,
                w: torch.Tensor = w,
            ) -> None:
                with torch.autocast("cuda", dtype=dtype, enabled=dtype is torch.bfloat16):
                    y = way(x, w)
                y.float().square().sum().backward()

            def val(
                way: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = way,
                dtype: torch.dtype = dtype,
                xv: torch.Tensor = xv,
                w: torch.Tensor = w,
            ) -> None:
                with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype is torch.bfloat16):
                    way(xv, w)

            with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype is torch.bfloat16):
                out = way(x, w).float()
            reference = out if reference is None else reference
            error = float((out - reference).abs().max())
            report[f"{name}_{tag}_train_us"] = round(timed(train), 1)
            report[f"{name}_{tag}_val_us"] = round(timed(val), 1)
            print(
                f"{name:>9} {tag}: train batch 512 {report[f'{name}_{tag}_train_us']:8.1f} us, validation 10,000 "
                f"{report[f'{name}_{tag}_val_us']:8.1f} us (max difference from nhwc {error:.1e})",
                flush=True,
            )
    print(json.dumps({"card": torch.cuda.get_device_name(0), **report}))


if __name__ == "__main__":
    main()
