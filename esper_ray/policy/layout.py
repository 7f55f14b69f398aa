"""What a policy's inputs and outputs mean, recorded in its checkpoint: MAX_SLOTS, the feature layout, the
blueprint head's built-in name-to-index table, its size (MAX_BLUEPRINTS: the plug-ins' names take the entries past the
built-ins) and the blueprint cost features (env/blueprint_costs.py), and the network's architecture ("flat" or
"slots": TrainConfig.policy).

The spaces do not depend on the host (observation.py, masks.py), but they do depend on this code: a checkpoint
saved by code with another MAX_SLOTS, another feature layout or other blueprint indices would run and read its
inputs wrong, or stop on a shape error deep in torch. So the module's model_config carries `policy_layout` (set by
train/rllib/ppo_config.py), and a checkpoint whose layout differs is refused in one line naming what differs.
A layout saved before the architecture was recorded (issue 75) is a flat one: every such checkpoint stays loadable.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from esper_ray.contracts.actions import BLUEPRINT_TABLE, MAX_BLUEPRINTS, MAX_SLOTS, joint_size
from esper_ray.contracts.registry import TOPOLOGIES
from esper_ray.contracts.train_config import POLICY_ARCHITECTURES
from esper_ray.env.blueprint_costs import COST_FEATURES, COST_SCALE
from esper_ray.env.observation import BASE_FEATURES, SLOT_DESCRIPTORS, SLOT_FEATURES

LAYOUT_KEY = "policy_layout"
"""The model_config key of the layout."""

ARCHITECTURES = POLICY_ARCHITECTURES
"""flat: MorphoPolicyModule (policy/rl_module.py); slots: SlotPolicyModule (policy/slot_module.py)."""
FLAT = "flat"
"""The architecture of a layout that records none (saved before issue 75)."""


def policy_layout(architecture: str = FLAT) -> dict[str, Any]:
    """This code's layout for a network of `architecture`, as plain JSON values."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"policy={architecture!r}: choose one of {list(ARCHITECTURES)}")
    return {
        "architecture": architecture,
        "max_slots": MAX_SLOTS,
        "base_features": BASE_FEATURES,
        "slot_features": SLOT_FEATURES,
        "slot_descriptors": SLOT_DESCRIPTORS,
        "topologies": list(TOPOLOGIES),
        "joint_size": joint_size(),
        "blueprints": list(BLUEPRINT_TABLE),
        "max_blueprints": MAX_BLUEPRINTS,
        "blueprint_costs": [*COST_FEATURES, f"log1p({COST_SCALE:g} x added / host) / log1p({COST_SCALE:g})"],
    }


def architecture_of(layout: Any) -> str:
    """A layout's architecture; flat for one saved before the field existed."""
    return layout.get("architecture", FLAT) if isinstance(layout, dict) else FLAT


def check_layout(saved: Any, where: str, architecture: str | None = None) -> None:
    """ValueError in one line when `saved` (a checkpoint's layout) is not this code's for a network of `architecture`
    (None: the checkpoint's own, as eval and grow load whichever it is); `where` names the checkpoint."""
    if not isinstance(saved, dict):
        raise ValueError(
            f"{where}: records no policy layout: it was saved before policies ran on any host (issue 68), "
            f"its spaces sized for its own host's slots; train it again"
        )
    saved = {**saved, "architecture": architecture_of(saved)}
    own = saved["architecture"] if saved["architecture"] in ARCHITECTURES else FLAT  # an unknown one differs below
    current = policy_layout(architecture or own)
    differ = [
        f"{key} {saved.get(key)!r} there, {value!r} here" for key, value in current.items() if saved.get(key) != value
    ]
    if differ:
        raise ValueError(f"{where}: its policy layout does not match this code's: {'; '.join(differ)}")


def saved_layout(module_dir: Path) -> Any:
    """The layout in an RLModule checkpoint folder (its constructor's model_config), without building the module."""
    path = module_dir / "class_and_ctor_args.pkl"
    if not path.is_file():
        raise ValueError(f"{module_dir}: not an RLModule checkpoint (no {path.name})")
    with path.open("rb") as f:
        ctor = pickle.load(f)  # RLlib's own file in a checkpoint the user points at, as from_checkpoint reads it
    model_config = ctor["ctor_args_and_kwargs"][1].get("model_config") or {}
    return model_config.get(LAYOUT_KEY)
