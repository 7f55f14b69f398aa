"""Hosts by registered name (contracts/registry.py): a fresh one to train, one rebuilt from a saved description, and
a host's topology. The built-in ones are the CNN presets (digits, digits-impaired, cifar10, synthetic) and the
transformer presets (text, text-gpu, text-starved)."""

from __future__ import annotations

import functools
from typing import Any

import torch

from esper_ray.contracts import registry
from esper_ray.contracts.actions import MAX_SLOTS
from esper_ray.contracts.host import Topology
from esper_ray.morpho.host_api import HostModule, checked_host

Host = HostModule


def build_host(name: str) -> HostModule:
    """A fresh host of a registered name (a built-in preset or a plug-in's host), or of a run's import string."""
    return _built(registry.host(name), name)


def _built(entry: registry.HostEntry, name: str) -> HostModule:
    host = checked_host(registry.resolve(entry.entry_point)(**entry.kwargs), name)
    host.registered_name = name
    return host


def rebuild_host(name: str, description: dict[str, Any]) -> HostModule:
    """The host of a name registered in this process rebuilt from a saved `describe()`: only a registered host's
    class is built, whatever the file says, and an import string in the file is never resolved (it names code)."""
    entry = registry.registered_host(name)
    if entry is None:
        raise ValueError(f"host={name!r}: not registered in this process; registered: {registry.host_names()}")
    with torch.device("meta"):
        kind = type(_built(entry, name))
    host = checked_host(kind.from_description(dict(description)), name)
    host.registered_name = name
    return host


@functools.cache
def host_topology(name: str) -> Topology:
    """The topology a registered host declares (built on the meta device: shapes only)."""
    with torch.device("meta"):
        return build_host(name).topology


def default_host(task: str) -> str:
    """The host a task uses when a run names none: the first of those made for it."""
    hosts = registry.task(task).hosts
    if not hosts:
        raise ValueError(f"task={task!r} names no host of its own; set host_preset to one of {registry.host_names()}")
    return hosts[0]


def topology_of(task: str, host: str | None = None) -> str:
    """ "cnn", "transformer" or "vector": the topology of `host`, or of the task's own host."""
    return host_topology(host if host is not None else default_host(task)).value


@functools.cache
def host_slot_ids(name: str) -> tuple[str, ...]:
    """The slots a registered host declares, in its order (built on the meta device: shapes only)."""
    with torch.device("meta"):
        return tuple(build_host(name).slot_ids)


def default_slots(host: str, slots: tuple[str, ...]) -> tuple[str, ...]:
    """The slots a run uses when it names none: `slots` (the settings' default) where the host has them all (the
    built-in CNN hosts), else every slot the host declares, up to the policy's MAX_SLOTS (a plug-in's host names its
    own: h0, h1, ...), as `esper-ray grow` picks them."""
    own = host_slot_ids(host)
    return tuple(slots) if set(slots) <= set(own) else own[:MAX_SLOTS]
