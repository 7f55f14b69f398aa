"""One LSTM step on the CPU, one thread: nn.LSTM (oneDNN) against torch.lstm_cell with the same weights, for the
policy's two size presets. Why MorphoPolicyModule steps with the cell when it samples (esper_ray/policy/rl_module.py).

    python benchmarks/probes/lstm_step.py

Prints one JSON line: milliseconds per step of each, and whether their outputs agree to 1e-5.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable

import torch

from esper_ray.policy.rl_module import MODEL_PRESETS


def ms_per_call(fn: Callable[[], object], calls: int = 200) -> float:
    for _ in range(10):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return 1000 * (time.perf_counter() - start) / calls


def main() -> None:
    torch.set_num_threads(1)  # as in an env runner with one CPU
    report: dict[str, object] = {
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__}
    }
    for preset, sizes in MODEL_PRESETS.items():
        lstm = torch.nn.LSTM(sizes["hidden_size"], sizes["lstm_cell_size"], batch_first=True)
        x = torch.randn(1, 1, sizes["hidden_size"])
        h, c = torch.randn(1, sizes["lstm_cell_size"]), torch.randn(1, sizes["lstm_cell_size"])
        weights = (lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)
        with torch.inference_mode():
            module_out = lstm(x, (h[None], c[None]))[0][:, 0]
            cell_out = torch.lstm_cell(x[:, 0], (h, c), *weights)[0]
            report[preset] = {
                "nn_lstm_ms": round(ms_per_call(lambda lstm=lstm, x=x, h=h, c=c: lstm(x, (h[None], c[None]))), 3),
                "lstm_cell_ms": round(
                    ms_per_call(lambda x=x, h=h, c=c, weights=weights: torch.lstm_cell(x[:, 0], (h, c), *weights)), 3
                ),
                "agree_to_1e-5": bool(torch.allclose(module_out, cell_out, atol=1e-5, rtol=1e-5)),
            }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
