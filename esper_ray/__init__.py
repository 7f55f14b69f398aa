"""esper-ray: morphogenetic neural networks whose growth is controlled by a PPO policy, on Ray.

Your own parts (docs/plugins.md): `register_task`, `register_host` and `register_blueprint` (contracts/registry.py),
a host subclasses `HostModule` and declares its slots as `SlotSpec`s; `load_grown(DIR)` reloads a saved network.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's own flag without importing typing: the `esper-ray` script imports this first,
if TYPE_CHECKING:  # and each module it loads before cli.main's handler is a moment a Ctrl-C is a traceback
    from typing import Any

from esper_ray.contracts.host import SlotSpec  # noqa: E402  (after the TYPE_CHECKING block, see above)
from esper_ray.contracts.registry import register_blueprint, register_host, register_task  # noqa: E402

__version__ = "0.1.0"
__all__ = ["HostModule", "SlotSpec", "load_grown", "register_blueprint", "register_host", "register_task"]


def __getattr__(name: str) -> Any:
    """`esper_ray.load_grown(DIR)`: a saved grown network as an nn.Module (morpho/grown_artifact.py), and
    `esper_ray.HostModule`, the host API. Imported on first use, so `import esper_ray` stays light (no torch) and
    loading a network never imports Ray."""
    if name == "load_grown":
        from esper_ray.morpho.grown_artifact import load_grown

        return load_grown
    if name == "HostModule":
        from esper_ray.morpho.host_api import HostModule

        return HostModule
    raise AttributeError(f"module 'esper_ray' has no attribute {name!r}")
