"""What a flex_attention seed costs a text env's train step, eager against compiled: the measurement behind
FlexAttentionSeed's compiled attend (esper_ray/morpho/transformer_blueprints.py).

    python benchmarks/probes/flex_step.py            # needs a CUDA GPU (flex_attention has no CPU backward)

The text-starved host's shapes (batch 32, 64 bytes, 64 channels, 4 seed heads) in bf16 autocast. Each variant runs
the seed's forward and backward `--steps` times and prints the wall per step (what an eager train step pays,
Python included): attention (scaled_dot_product_attention, the attention seed), flex_eager (flex_attention run
eagerly, the flex_attention seed before), flex_compiled (through torch.compile; its first call, which compiles, is
timed apart). Also: the largest difference between the compiled and eager outputs and input gradients, and
whether the compiled seed's step can be captured in a CUDA graph and replayed (with the input's gradient and
without; on failure the error and the end of its traceback). Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import torch

from esper_ray.morpho import transformer_blueprints as tb


def step(seed: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = seed(x)
    y.float().square().mean().backward()
    return y.detach()  # no autograd graph kept alive past the step (see capture)


def wall_per_step(seed: torch.nn.Module, x: torch.Tensor, steps: int) -> float:
    for _ in range(3):
        step(seed, x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step(seed, x)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(32, 64, 64, device=device, requires_grad=True)
    out: dict[str, object] = {"card": torch.cuda.get_device_name(device), "torch": torch.__version__}

    attention = tb.AttentionSeed(64).to(device)
    torch.nn.init.normal_(attention.proj.weight, std=0.02)  # not at birth: every path computes
    out["attention_ms"] = 1e3 * wall_per_step(attention, x, args.steps)

    flex = tb.FlexAttentionSeed(64).to(device)
    flex.load_state_dict(attention.state_dict())
    # the seed as it ran before: flex_attention eager on the GPU too (an instance attribute over the method)
    flex.attend = lambda q, k, v: tb.eager_flex_attention(q, k, v, flex._mask(q))  # type: ignore[method-assign]
    out["flex_eager_ms"] = 1e3 * wall_per_step(flex, x, max(5, args.steps // 10))
    x.grad = None
    y_eager = step(flex, x)
    g_eager = x.grad.clone()

    del flex.attend  # back to the seed's own attend: compiled on a GPU
    x.grad = None
    start = time.perf_counter()
    y_compiled = step(flex, x)
    torch.cuda.synchronize()
    out["flex_compiled_first_call_s"] = time.perf_counter() - start
    out["flex_compiled_max_abs_diff_out"] = (y_compiled.float() - y_eager.float()).abs().max().item()
    out["flex_compiled_max_abs_diff_grad"] = (x.grad - g_eager).abs().max().item()
    out["flex_compiled_ms"] = 1e3 * wall_per_step(flex, x, args.steps)

    # The outputs above keep their autograd graphs, and with them AccumulateGrad nodes made on the default stream:
    # a backward on the capture's stream would then accumulate on the default one, which invalidates the capture.
    del y_eager, y_compiled
    # First as the probe's input without a gradient of its own (a failed capture may spoil the next one), then with
    # the input's gradient accumulated across streams, as the probe first tried.
    out["flex_compiled_capturable_no_input_grad"] = capture(flex, x.detach().clone())
    out["flex_compiled_capturable"] = capture(flex, x)
    print(json.dumps(out))


def capture(seed: torch.nn.Module, x: torch.Tensor) -> object:
    """Whether a step of `seed` on `x` can be captured in a CUDA graph and replayed: True, or the error with the
    last lines of its traceback (what an undiagnosed failure needs)."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                step(seed, x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(seed, x)
        graph.replay()
        torch.cuda.synchronize()
        return True
    except Exception as err:  # noqa: BLE001 - the probe reports what capture says
        trace = traceback.format_exc().strip().splitlines()
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}", "traceback_tail": trace[-12:]}


if __name__ == "__main__":
    main()
