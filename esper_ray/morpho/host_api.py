"""What a host network must offer to be grown: its slots (id, shape, topology), a JSON description it can be
rebuilt from, and a forward that calls a hook at each slot. The built-in CNN and transformer hosts implement it,
and so does a plug-in host (docs/plugins.md).

    class MyMLP(HostModule):
        def __init__(self, widths=(32, 32)): ...
        def slots(self): return [SlotSpec("h0", (32,), "vector"), ...]   # in the order of the policy's slots
        def describe(self): return {"widths": list(self.widths)}        # MyMLP(**that) builds it again
        def example_input(self): return torch.zeros(1, 64)              # one input row, for counting FLOPs
        def forward(self, x, at_slot=None, hooked=None):                # x = at_slot("h0", x) where h0 sits
"""

from __future__ import annotations

import json
from collections.abc import Callable, Container
from typing import Any

import torch
from torch import nn

from esper_ray.contracts.host import SlotSpec, Topology

SlotHook = Callable[[str, torch.Tensor], torch.Tensor]


class HostModule(nn.Module):
    """A host network with named injection slots. Subclasses implement `slots`, `describe`, `example_input` and
    `forward`; the rest derives from `slots`."""

    registered_name: str | None = None
    """The registry name it was built under (morpho/hosts.py sets it), which a saved network records."""

    def slots(self) -> list[SlotSpec]:
        """The injection points, in the order the policy's observation and action head list them."""
        raise NotImplementedError(f"{type(self).__name__}.slots(): a host declares its slots (id, shape, topology)")

    def describe(self) -> dict[str, Any]:
        """Plain JSON values from which `from_description` builds this network again (a saved network's host)."""
        raise NotImplementedError(f"{type(self).__name__}.describe(): a host describes itself as JSON")

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> HostModule:
        """A fresh host from `describe()`'s output; by default `cls(**description)`."""
        return cls(**description)

    def example_input(self) -> torch.Tensor:
        """One input row ([1, ...], of the dtype `forward` takes): FLOPs are counted from a forward of it."""
        raise NotImplementedError(f"{type(self).__name__}.example_input(): one input row, e.g. torch.zeros(1, 64)")

    def forward(
        self, x: torch.Tensor, at_slot: SlotHook | None = None, hooked: Container[str] | None = None
    ) -> torch.Tensor:
        """Logits for a batch `x`; at each slot, `h = at_slot(slot_id, h)` (when `at_slot` is given and `hooked` is
        None or holds the slot: others may be skipped, calling them anyway is harmless)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ derived from slots()
    @property
    def topology(self) -> Topology:
        kinds = {s.topology for s in self.slots()}
        if len(kinds) != 1:
            raise ValueError(
                f"{type(self).__name__}: slots of topologies {sorted(k.value for k in kinds)}; a host's "
                "slots share one topology (the policy's blueprint mask is one per host)"
            )
        return kinds.pop()

    @property
    def slot_ids(self) -> list[str]:
        return [s.id for s in self.slots()]

    def slot_spec(self, slot: str) -> SlotSpec:
        for spec in self.slots():
            if spec.id == slot:
                return spec
        raise ValueError(f"slot {slot!r} does not exist in this host; available slots: {self.slot_ids}")

    def slot_channels(self, slot: str) -> int:
        return self.slot_spec(slot).channels

    def slot_shape(self, slot: str) -> tuple[int, ...]:
        return self.slot_spec(slot).shape


def checked_host(host: Any, name: str) -> HostModule:
    """`host` if it offers the host API, else ValueError in one line naming the host and what is missing."""
    if not isinstance(host, HostModule):
        raise ValueError(
            f"host {name!r}: its builder returned a {type(host).__name__}; a host subclasses "
            "esper_ray.HostModule (docs/plugins.md)"
        )
    slots = host.slots()
    if not slots or not all(isinstance(s, SlotSpec) for s in slots):
        raise ValueError(f"host {name!r}: slots() returned {slots!r}; expected a non-empty list of SlotSpec")
    ids = [s.id for s in slots]
    if len(set(ids)) != len(ids):
        raise ValueError(f"host {name!r}: slots() names a slot twice: {ids}")
    host.topology  # noqa: B018  (reading the property checks there is one topology)
    description = host.describe()
    try:
        json.dumps(description, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"host {name!r}: describe() returned {description!r}, not plain JSON ({err})") from None
    if not isinstance(description, dict):
        raise ValueError(f"host {name!r}: describe() returned a {type(description).__name__}; expected a dict")
    return host
