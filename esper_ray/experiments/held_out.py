"""Held-out hosts of an experiment file: hosts no arm trains on, where every trial's evaluation runs.

    held_out:                       # a list of {name, env} (env: EnvConfig overrides of the training settings)
      - {name: digits, env: {task: digits, max_epochs: 25}}
      - {name: synthetic, env: {task: synthetic, synthetic_size: 2000}}
    held_out: digits-held-out       # or the name of a registered host family (esper_ray/contracts/families.py)
    held_out: [digits-held-out-starved, grow-held-out]   # or several families' (entries of the list above may mix in)

A trial then evaluates on each host in turn (its `eval_episodes` there) and reports, per host, the metric under
`eval/<metric>/<host>` and the host runs it spent there (`eval/host_runs/<host>`: the cost of a new host); its
`eval/<metric>` is the mean over the hosts. A host's settings are the arm's, with the host's `env` on top:
task, slots, max_epochs and plugins go to the training settings, the rest into `env`; a `family` the arm trains
on is dropped (the held-out host is one host, not a draw from the family).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from esper_ray.contracts import families
from esper_ray.contracts.train_config import TRAIN_OWNED_ENV_KEYS
from esper_ray.experiments.folder_names import check_folder_name

HOST_LEVEL_KEYS = ("task", "slots", "max_epochs", "plugins")
"""Env settings a held-out host may set that are training settings (TrainConfig's own, not under `env`)."""
RUN_OWNED_KEYS = sorted(TRAIN_OWNED_ENV_KEYS - set(HOST_LEVEL_KEYS))
"""Env settings a host may not set: the run's seed and shards, the arm's reward (what is compared stays the same)."""
FAMILY_KEY = "family"
"""The training (and env) setting that draws each episode's host from a family (contracts/families.py)."""
EXAMPLE = "e.g. [{name: digits, env: {task: digits}}]"


@dataclass(frozen=True)
class HeldOutHost:
    name: str
    """Its name in results and reports (`eval/test_accuracy/<name>`): a plain folder-like name."""
    env: Mapping[str, Any]
    """EnvConfig overrides of the arm's settings: task, host_preset, max_epochs, slots, data settings, ..."""


def parse_held_out(value: Any) -> tuple[HeldOutHost, ...]:
    """`held_out:` as hosts: a list of {name, env}, or a family's name. ValueError naming the entry, the value and
    what is allowed."""
    if isinstance(value, str):
        return family_hosts(value)
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"held_out={value!r}: must be a non-empty list of hosts, {EXAMPLE}, or a host family's name")
    hosts: list[HeldOutHost] = []
    for i, entry in enumerate(value):
        where = f"held_out[{i}]"
        if isinstance(entry, str):  # a family's name: its members
            hosts.extend(family_hosts(entry))
            continue
        if not isinstance(entry, Mapping) or set(entry) != {"name", "env"}:
            raise ValueError(
                f"{where}={entry!r}: each host is a mapping with exactly `name` and `env`, {EXAMPLE}, or a "
                "family's name"
            )
        hosts.append(_host(entry["name"], entry["env"], where))
    names = [h.name for h in hosts]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"held_out: host name(s) {twice} given more than once; each host needs a name of its own")
    return tuple(hosts)


def _host(name: Any, env: Any, where: str) -> HeldOutHost:
    check_folder_name(f"{where}.name", name, "host name")
    if not isinstance(env, Mapping):
        raise ValueError(
            f"{where}.env={env!r}: must be a mapping of env settings, e.g. {{task: digits, max_epochs: 25}}"
        )
    owned = sorted(set(env) & set(RUN_OWNED_KEYS))
    if owned:
        raise ValueError(
            f"{where}.env: {owned} are the run's (its seed, shards and reward), not a host's; a host may set "
            f"{list(HOST_LEVEL_KEYS)} and any other env setting"
        )
    return HeldOutHost(str(name), copy.deepcopy(dict(env)))


def family_hosts(name: str) -> tuple[HeldOutHost, ...]:
    """The members of a registered host family, as held-out hosts. Refused in one line where the name is not one."""
    try:
        members = families.family(name)
    except ValueError as err:
        raise ValueError(f"held_out={name!r}: {err}") from None
    return tuple(_host(m.name, m.env, f"held_out ({name}).{m.name}") for m in members)


def host_settings(arm_settings: Mapping[str, Any], host: HeldOutHost) -> dict[str, Any]:
    """The TrainConfig settings of an arm's trial on a held-out host: the arm's, less any family, with the host's
    env on top (its task, slots, max_epochs and plugins at the top level). A host that names a task of its own
    drops the arm's host_preset unless it names one too (the arm's host may not fit the host's data)."""
    out = {k: copy.deepcopy(v) for k, v in arm_settings.items() if k != FAMILY_KEY}
    env = {k: copy.deepcopy(v) for k, v in dict(out.get("env", {})).items() if k != FAMILY_KEY}
    if "task" in host.env and "host_preset" not in host.env:
        env.pop("host_preset", None)
    for key, value in host.env.items():
        if key in HOST_LEVEL_KEYS:
            out[key] = copy.deepcopy(value)
        else:
            env[key] = copy.deepcopy(value)
    out["env"] = env
    return out


def host_key(column: str, host: str) -> str:
    """`test_accuracy/digits`: a per-host figure's name in a trial's evaluation (its result key has `eval/` before)."""
    return f"{column}/{host}"
