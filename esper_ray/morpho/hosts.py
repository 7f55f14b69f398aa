"""Which host network a task grows: a CNN for the image tasks, a transformer for `text`."""

from __future__ import annotations

from esper_ray.morpho.host import HOST_PRESETS, CNNHost
from esper_ray.morpho.transformer import TRANSFORMER_PRESETS, TransformerHost

HOST_PRESET_NAMES = tuple(sorted(HOST_PRESETS)) + tuple(sorted(TRANSFORMER_PRESETS))


Host = CNNHost | TransformerHost


def build_host(preset: str) -> Host:
    """A fresh host of a preset: a task name (digits, digits-impaired, cifar10, synthetic, text), text-gpu or text-starved."""
    if preset in HOST_PRESETS:
        return CNNHost(HOST_PRESETS[preset])
    if preset in TRANSFORMER_PRESETS:
        return TransformerHost(TRANSFORMER_PRESETS[preset])
    raise ValueError(f"unknown host preset {preset!r}; available: {', '.join(HOST_PRESET_NAMES)}")


def topology_of(task: str) -> str:
    """"transformer" for the text task, "cnn" for the image tasks."""
    return "transformer" if task == "text" else "cnn"
