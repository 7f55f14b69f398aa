"""A grown network on disk: `weights.pt` (a state_dict) and `architecture.json`, and `load_grown` to read them back.

    DIR/weights.pt          torch.save of GrownNetwork.state_dict(): tensors only, so it loads with
                            torch.load(weights_only=True) and runs no code from the file
    DIR/architecture.json   topology, host config, every kept seed (slot, blueprint, blend, alpha, stage),
                            parameter counts, plus what the writer adds (the run's settings and curves)

The architecture file is written last: a folder without it is an unfinished save. Loading needs torch and
esper-ray's morpho layer only (no Ray), so a grown network can be used wherever esper-ray is installed.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from esper_ray.contracts.host import Topology
from esper_ray.morpho.blueprints import count_params
from esper_ray.morpho.grown import CONTENTS, GrownNetwork, GrownSeedSpec, empty_grown_network, host_config_of

WEIGHTS_FILE = "weights.pt"
ARCHITECTURE_FILE = "architecture.json"
FORMAT = "esper-ray grown network"
FORMAT_VERSION = 1
WRITTEN_BY = "`esper-ray eval --save DIR` or `esper-ray heuristic --save DIR`"


def describe(network: GrownNetwork) -> dict[str, Any]:
    """The architecture file's own part: what `load_grown` needs, and the parameter counts."""
    seeds = [{**spec.as_dict(), "params": network.seed_params(spec.slot)} for spec in network.seed_specs]
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "topology": network.topology.value,
        "host_config": host_config_of(network.host),
        "contents": CONTENTS,
        "seeds": seeds,
        "params": {"host": network.host_params, "seeds": sum(s["params"] for s in seeds), "total": count_params(network)},
    }


def save_grown_network(directory: Path, network: GrownNetwork, extra: Mapping[str, Any]) -> None:
    """Write the weights, then the architecture file (`describe` plus `extra`, whose keys must not clash)."""
    description = describe(network)
    clash = sorted(set(description) & set(extra))
    if clash:
        raise ValueError(f"extra architecture keys {clash} would overwrite the network's own description")
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", memory_format=torch.contiguous_format) for k, v in network.state_dict().items()}
    torch.save(state, directory / WEIGHTS_FILE)
    (directory / ARCHITECTURE_FILE).write_text(json.dumps({**description, **extra}, indent=2, allow_nan=False) + "\n")


def read_architecture(directory: str | Path) -> dict[str, Any]:
    """The parsed architecture file of a saved grown network (checked to be one)."""
    folder = Path(directory).expanduser()
    path = _required(folder, ARCHITECTURE_FILE)
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err}); the file is damaged, save the network again") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"{path}: not the architecture file of a grown network (its 'format' is not {FORMAT!r})")
    if raw.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version={raw.get('format_version')!r}; this esper-ray reads version {FORMAT_VERSION}")
    for key in ("topology", "host_config", "seeds", "params"):
        if key not in raw:
            raise ValueError(f"{path}: has no {key!r}; the file is damaged, save the network again")
    return raw


def load_grown(directory: str | Path) -> GrownNetwork:
    """The grown network saved in `directory`, on the CPU, in eval mode: `esper_ray.load_grown("grown/")(x)`.

    Raises FileNotFoundError naming a missing file, ValueError for a damaged one.
    """
    folder = Path(directory).expanduser()
    architecture = read_architecture(folder)
    weights = _required(folder, WEIGHTS_FILE)
    where = str(folder / ARCHITECTURE_FILE)
    try:
        topology = Topology(architecture["topology"])
    except ValueError:
        raise ValueError(f"{where}: topology={architecture['topology']!r}; expected one of {[t.value for t in Topology]}") from None
    specs = [GrownSeedSpec.from_dict(s, where) for s in architecture["seeds"]]
    try:
        network = empty_grown_network(topology, architecture["host_config"], specs)
    except (TypeError, ValueError) as err:  # host_config fields the host config does not take, a slot it lacks, ...
        raise ValueError(f"{where}: describes no network this esper-ray can build ({err})") from None
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as err:  # a truncated zip: OSError
        raise ValueError(f"{weights}: unreadable ({str(err).splitlines()[0]}); the file is damaged, save the network again") from None
    try:
        network.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{weights} does not fit {where}: {' '.join(str(err).split())}") from None  # one line
    if count_params(network) != architecture["params"].get("total"):
        raise ValueError(f"{where} says {architecture['params'].get('total')} parameters; the network built from it has "
                         f"{count_params(network)}")
    return network.eval()


def _required(folder: Path, name: str) -> Path:
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (a grown network is a folder written by {WRITTEN_BY})")
    path = folder / name
    if not path.is_file():
        present = sorted(p.name for p in folder.iterdir())
        raise FileNotFoundError(f"{path} is missing: {folder} is not a complete grown network (it holds {present or 'nothing'}; "
                                f"{WRITTEN_BY} writes {WEIGHTS_FILE} and {ARCHITECTURE_FILE}, the latter last)")
    return path
