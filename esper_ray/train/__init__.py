"""Training, in five sub-packages by job: rllib/ (the RLlib glue), process/ (processes, threads, the Ray cluster),
folders/ (a run folder: checkpoints, manifests, the lock), commands/ (the command bodies) and output/ (what a
command shows: progress, summaries, TensorBoard).

A checkpoint pickles the classes and functions its PPO config names by module path (the env runner, learner, env
factory, callbacks, connectors; the algorithm with `overlap: true`), and those modules were esper_ray.train.X
before rllib/ held them. So the old paths still import, as the same module objects: checkpoints written before the
move resume, evaluate and grow as they did. Fresh checkpoints name the new paths. A finder, not an import of each
module here: importing any train module must not import RLlib (a command's --help, the reaper's own process)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

PICKLED_BEFORE_THE_MOVE = (
    "algorithm_host",
    "callbacks",
    "clawback",
    "env_factory",
    "env_runner",
    "learner",
    "overlap",
    "ppo_config",
    "reward_normalizer",
    "rounds",
    "step_failures",
)
MOVED = {f"{__name__}.{name}": f"{__name__}.rllib.{name}" for name in PICKLED_BEFORE_THE_MOVE}
"""Old module path -> where the module is now."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path as the module at its new one (one object under both names)."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        return importlib.machinery.ModuleSpec(name, self) if name in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # importlib sets the module's __spec__ to this alias spec; put it back
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = module.__spec__.loader_state  # type: ignore[union-attr]


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
