"""esper-ray: morphogenetic neural networks whose growth is controlled by a PPO policy, on Ray."""

from __future__ import annotations

TYPE_CHECKING = False  # typing's own flag without importing typing: the `esper-ray` script imports this first,
if TYPE_CHECKING:      # and each module it loads before cli.main's handler is a moment a Ctrl-C is a traceback
    from typing import Any

__version__ = "0.1.0"
__all__ = ["load_grown"]


def __getattr__(name: str) -> Any:
    """`esper_ray.load_grown(DIR)`: a saved grown network as an nn.Module (morpho/grown_artifact.py). Imported on
    first use, so `import esper_ray` stays light and loading a network never imports Ray."""
    if name == "load_grown":
        from esper_ray.morpho.grown_artifact import load_grown

        return load_grown
    raise AttributeError(f"module 'esper_ray' has no attribute {name!r}")
