"""A grown network on disk: `weights.pt` (a state_dict) and `architecture.json`, and `load_grown` to read them back.

    DIR/weights.pt          torch.save of GrownNetwork.state_dict(): tensors only, so it loads with
                            torch.load(weights_only=True) and runs no code from the file
    DIR/architecture.json   topology, host config, every kept seed (slot, blueprint, blend, alpha, stage),
                            parameter counts, plus what the writer adds (the run's settings and curves)

The architecture file is written last: a folder without it is an unfinished save. Loading needs torch and
esper-ray's morpho layer only (no Ray), so a grown network can be used wherever esper-ray is installed. It runs no
code the folder names: the plug-ins a file lists are imported only when the caller passes them (`plugins=`).
"""

from __future__ import annotations

import json
import pickle
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from esper_ray.contracts import registry
from esper_ray.contracts.host import Topology
from esper_ray.morpho.blueprints import count_params
from esper_ray.morpho.grown import CONTENTS, GrownNetwork, GrownSeedSpec, empty_grown_network, host_config_of
from esper_ray.morpho.host_api import HostModule

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
        "host": network.host.registered_name,
        "plugins": list(network.plugins),
        "host_config": host_config_of(network.host),
        "contents": CONTENTS,
        "seeds": seeds,
        "params": {
            "host": network.host_params,
            "seeds": sum(s["params"] for s in seeds),
            "total": count_params(network),
        },
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


MAX_ARCHITECTURE_BYTES = 16 * 2**20
"""architecture.json holds the description and the run's curves: kilobytes. A larger one is not ours."""
MAX_LAYERS = 64
"""Host config fields that each add modules (blocks, pooling layers, transformer layers): more would make even
building the network's skeleton slow."""
LAYER_FIELDS = ("blocks", "pool_layers", "n_layers")
MAX_SIZE_FIELD = 2**24
"""Any other integer of a host config (channels, image side, classes, vocabulary, widths, heads)."""
WEIGHTS_SLACK_BYTES = 2**20
"""What weights.pt may hold beyond the tensors its architecture describes (the zip's records and names)."""
MAX_DERIVED_BYTES = 2**26
"""Bytes of the buffers a network builds from its architecture alone and weights.pt does not hold (a banded
transformer's causal mask, seq_len x seq_len per layer): the file's size cannot bound them, so this does. The
text presets need under 13 KB; 64 MiB is a 2,048-byte context with 16 banded layers."""


def read_architecture(directory: str | Path) -> dict[str, Any]:
    """The parsed architecture file of a saved grown network (checked to be one, with fields of the right types)."""
    folder = Path(directory).expanduser()
    path = _required(folder, ARCHITECTURE_FILE)
    if path.stat().st_size > MAX_ARCHITECTURE_BYTES:
        raise ValueError(
            f"{path}: {path.stat().st_size:,} bytes, more than an architecture file holds "
            f"({MAX_ARCHITECTURE_BYTES:,} at most); it is not one esper-ray wrote"
        )
    try:
        raw = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as err:  # RecursionError: nesting deeper than JSON needs
        raise ValueError(
            f"{path}: not valid JSON ({type(err).__name__}: {_first_line(err)}); the file is damaged, "
            "save the network again"
        ) from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"{path}: not the architecture file of a grown network (its 'format' is not {FORMAT!r})")
    if raw.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: format_version={raw.get('format_version')!r}; this esper-ray reads version {FORMAT_VERSION}"
        )
    for key, kind, expected in (
        ("topology", str, "a string"),
        ("host_config", dict, "a mapping"),
        ("seeds", list, "a list"),
        ("params", dict, "a mapping"),
    ):
        if key not in raw:
            raise ValueError(f"{path}: has no {key!r}; the file is damaged, save the network again")
        if not isinstance(raw[key], kind):
            raise ValueError(f"{path}: {key}={_short(raw[key])}; expected {expected}")
    for i, seed in enumerate(raw["seeds"]):
        if not isinstance(seed, dict):
            raise ValueError(
                f"{path}: seeds[{i}]={_short(seed)}; expected a mapping (slot, blueprint, blend, alpha, stage)"
            )
    return raw


def load_grown(directory: str | Path, plugins: Sequence[str] | None = None) -> GrownNetwork:
    """The grown network saved in `directory`, on the CPU, in eval mode: `esper_ray.load_grown("grown/")(x)`.

    Runs no code the folder names: the weights load with weights_only=True, and the host and blueprints must be
    registered in this process (the built-in ones, or a plug-in you imported). The file's `plugins` list is never
    imported, and a host named by an import string (`my_mlp:MyMLP`) is never resolved from the file alone: a
    network of plug-in parts loads with `load_grown(DIR, plugins=["my_mlp"])`, which imports exactly the plug-ins
    you pass (they are code: pass only those you trust, as torch.load(weights_only=False) asks), and then resolves
    a host import string whose module you passed, if it names a HostModule class. Otherwise ValueError in one line
    naming what is missing and the plug-ins the file names.

    Allocates nothing before the sizes check out: the architecture is built first on torch's meta device, which
    holds shapes only, and the tensors it needs must fit what weights.pt holds. Raises FileNotFoundError naming a
    missing file, ValueError (one line) for a damaged or hostile one.
    """
    folder = Path(directory).expanduser()
    trusted = _checked_caller_plugins(plugins)
    architecture = read_architecture(folder)
    weights = _required(folder, WEIGHTS_FILE)
    where = str(folder / ARCHITECTURE_FILE)
    try:
        topology = Topology(architecture["topology"])
    except ValueError:
        raise ValueError(
            f"{where}: topology={architecture['topology']!r}; expected one of {[t.value for t in Topology]}"
        ) from None
    host_name, named = _checked_parts(architecture, where)
    specs = [GrownSeedSpec.from_dict(s, where) for s in architecture["seeds"]]
    registry.load_plugins(trusted, field="load_grown(plugins=...)", hint="")  # the caller's trust, never the file's
    host_entry = _registered_parts(folder, topology, host_name, specs, named, trusted)
    builtin = host_entry is None or host_entry.builtin
    host_config = _checked_host_config(architecture["host_config"], where, plugin=not builtin)
    with torch.device("meta"):  # shapes only: what the description asks for, before anything is allocated
        skeleton = _build(topology, host_config, specs, where, host_name, named)
    tensors = skeleton.state_dict(keep_vars=True)
    entries = sum(t.numel() * t.element_size() for t in tensors.values())
    stored = sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors.values()}.values())  # tied: once
    _check_weights_size(weights, stored, entries, where)
    _check_derived_size(skeleton, tensors, where)
    network = _build(topology, host_config, specs, where, host_name, named)
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # weights_only refused an object: the file is more than tensors
        refused = next(
            (line.strip() for line in str(err).splitlines() if "GLOBAL" in line or "Unsupported" in line),
            _first_line(err),
        ).split(". ")[0]  # what was refused, without torch's advice to allow it
        raise ValueError(
            f"{weights}: refused, it holds more than tensors ({refused}); esper-ray saves tensors only, so "
            "this file was written by something else: never load it with weights_only=False unless you "
            "trust where it came from"
        ) from None
    except (
        RuntimeError,
        OSError,
        EOFError,
        zipfile.BadZipFile,
        ValueError,
        KeyError,
    ) as err:  # a truncated zip: OSError
        raise ValueError(
            f"{weights}: unreadable ({type(err).__name__}: {_first_line(err)}); the file is damaged, "
            "save the network again"
        ) from None
    if not isinstance(state, dict):
        raise ValueError(f"{weights}: holds a {type(state).__name__}, not a state_dict; save the network again")
    try:
        network.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{weights} does not fit {where}: {' '.join(str(err).split())}") from None  # one line
    total = architecture["params"].get("total")
    if count_params(network) != total:
        raise ValueError(
            f"{where} says {_short(total)} parameters; the network built from it has {count_params(network)}"
        )
    return network.eval()


def _checked_caller_plugins(plugins: Sequence[str] | None) -> list[str]:
    if plugins is None:
        return []
    if (
        isinstance(plugins, (str, bytes))
        or not isinstance(plugins, Sequence)
        or not all(isinstance(p, str) for p in plugins)
    ):
        raise ValueError(
            f"load_grown(plugins={_short(plugins)}): expected a list of import strings, e.g. plugins=['my_mlp']"
        )
    return list(plugins)


def plugins_needed(architecture: Mapping[str, Any]) -> list[str]:
    """The plug-ins a saved network's file says its parts come from: its `plugins`, and the module of a host named
    by an import string (`my_mlp:MyMLP`), for `load_grown(DIR, plugins=...)` and the words that suggest it."""
    named = [p for p in architecture.get("plugins", []) if isinstance(p, str)]
    host = architecture.get("host")
    if isinstance(host, str) and ":" in host and not any(p.partition(":")[0] == host.partition(":")[0] for p in named):
        named.append(host.partition(":")[0])
    return named


def _registered_parts(
    folder: Path,
    topology: Topology,
    host_name: str | None,
    specs: list[GrownSeedSpec],
    named: list[str],
    trusted: list[str],
) -> registry.HostEntry | None:
    """The host's registry entry (None for files written before the registry), once the host and every seed's
    blueprint are registered in this process. A host import string is resolved only where `trusted` (the caller's
    plug-ins) names its module, already imported, and it names a HostModule class: never on the file's word."""
    missing = []
    entry = registry.registered_host(host_name) if host_name is not None else None
    if host_name is not None and entry is None:
        module_name, _, attribute = host_name.partition(":")
        module = sys.modules.get(module_name) if module_name in {p.partition(":")[0] for p in trusted} else None
        host_class = getattr(module, attribute, None) if attribute and "." not in attribute else None
        if isinstance(host_class, type) and issubclass(host_class, HostModule):
            entry = registry.host(host_name)  # the module is imported and trusted, the class a host: registers it
        else:
            missing.append(f"host {host_name!r}")
    host_missing = bool(missing)
    missing += [
        f"{topology.value} blueprint {s.blueprint.key!r}"
        for s in specs
        if not registry.has_blueprint(topology.value, s.blueprint.key)
    ]
    if missing and (named or host_missing):  # else a file naming no plug-in and a known host: the build says what fits
        suggested = plugins_needed({"plugins": named, "host": host_name}) or ["your_module"]
        where = folder / ARCHITECTURE_FILE
        said = f"plug-ins {named}" if named else "no plug-in"
        raise ValueError(
            f"{where}: {', '.join(missing)} not registered in this process; the file names {said}, and "
            "load_grown imports no code a file names: if you trust them, pass them, "
            f"esper_ray.load_grown({str(folder)!r}, plugins={suggested!r}), or import the module first"
        )
    return entry


def _checked_host_config(config: dict[str, Any], where: str, *, plugin: bool = False) -> dict[str, Any]:
    """The host config's values, each a plain number within limits (the host config classes check the rest); a
    plug-in host's description may also hold floats, booleans, short strings and lists of integers."""
    for key, value in config.items():
        if value is None or (isinstance(value, float) and (plugin or key == "dropout")):
            continue
        if plugin and (isinstance(value, bool) or (isinstance(value, str) and len(value) <= 200)):
            continue
        limit = MAX_LAYERS if key in LAYER_FIELDS else MAX_SIZE_FIELD
        items = value if plugin and isinstance(value, list) and len(value) <= MAX_LAYERS else [value]
        for item in items:
            if isinstance(item, bool) or not isinstance(item, int):
                raise ValueError(f"{where}: host_config.{key}={_short(value)}; expected an integer")
            if not 0 <= item <= limit:
                raise ValueError(
                    f"{where}: host_config.{key}={_short(value) if plugin else value}; "
                    f"expected an integer in [0, {limit:,}]"
                )
    return config


def _checked_parts(architecture: dict[str, Any], where: str) -> tuple[str | None, list[str]]:
    """The registered host name and the plug-in modules a file names (files written before the registry: none)."""
    host_name, plugins = architecture.get("host"), architecture.get("plugins", [])
    if host_name is not None and not isinstance(host_name, str):
        raise ValueError(f"{where}: host={_short(host_name)}; expected a registered host's name")
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise ValueError(f"{where}: plugins={_short(plugins)}; expected a list of import strings")
    return host_name, plugins


def _build(
    topology: Topology,
    host_config: dict[str, Any],
    specs: list[GrownSeedSpec],
    where: str,
    host_name: str | None = None,
    plugins: list[str] | tuple[str, ...] = (),
) -> GrownNetwork:
    try:
        return empty_grown_network(topology, host_config, specs, host_name, plugins)
    except (
        TypeError,
        ValueError,
        KeyError,
        RuntimeError,
        OverflowError,
    ) as err:  # fields the config does not take, ...
        raise ValueError(f"{where}: describes no network this esper-ray can build ({_first_line(err)})") from None


def _check_weights_size(weights: Path, stored: int, entries: int, where: str) -> None:
    """Before torch reads a tensor, and before the network is allocated: weights.pt's zip directory must declare
    stored (uncompressed, as torch.save writes) entries that fit in the file, at least the `stored` bytes of
    distinct tensors the architecture describes, and at most its `entries` bytes (tied tensors counted per name)
    plus the zip's records. So what is allocated is bounded by the bytes on disk, whatever the JSON asks for."""
    size = weights.stat().st_size
    if size == 0:
        raise ValueError(
            f"{weights}: empty (0 bytes), as an interrupted copy leaves it; save or copy the network again"
        )
    try:
        with zipfile.ZipFile(weights) as archive:
            listed = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise ValueError(
            f"{weights}: unreadable, not the zip file torch.save writes ({_first_line(err)}); the file is "
            "damaged, save the network again"
        ) from None
    packed = next((e for e in listed if e.compress_type != zipfile.ZIP_STORED or e.compress_size != e.file_size), None)
    if packed is not None:
        raise ValueError(
            f"{weights}: entry {packed.filename!r} is compressed; torch.save stores entries as they are, so "
            "this file was not written by esper-ray; not loaded"
        )
    declared = sum(e.file_size for e in listed)
    if declared > size:
        raise ValueError(
            f"{weights}: its entries declare {declared:,} bytes in a file of {size:,}; the file is damaged"
        )
    if declared < stored:
        raise ValueError(
            f"{where} describes {stored:,} bytes of tensors and {weights} holds {declared:,}: not the "
            "weights of that network (or a file cut short); not loaded"
        )
    if declared > entries + WEIGHTS_SLACK_BYTES:
        raise ValueError(
            f"{weights}: holds {declared:,} bytes, more than the {entries:,} bytes of tensors {where} "
            "describes; not loaded"
        )


def _check_derived_size(skeleton: GrownNetwork, stored: Mapping[str, torch.Tensor], where: str) -> None:
    """The buffers `skeleton` (on the meta device) builds that weights.pt does not hold, within MAX_DERIVED_BYTES:
    their size follows from the JSON alone (a 170 KB file may ask for a seq_len^2 mask in each of 64 layers)."""
    derived = {name: b.numel() * b.element_size() for name, b in skeleton.named_buffers() if name not in stored}
    total = sum(derived.values())
    if total > MAX_DERIVED_BYTES:
        largest = max(derived, key=derived.__getitem__)
        raise ValueError(
            f"{where}: its host_config builds {total:,} bytes of buffers that {WEIGHTS_FILE} does not hold "
            f"({len(derived)} of them, {largest} {derived[largest]:,} bytes); at most {MAX_DERIVED_BYTES:,} "
            "are allowed; not loaded"
        )


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _required(folder: Path, name: str) -> Path:
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (a grown network is a folder written by {WRITTEN_BY})")
    path = folder / name
    if not path.is_file():
        present = sorted(p.name for p in folder.iterdir())
        raise FileNotFoundError(
            f"{path} is missing: {folder} is not a complete grown network (it holds {present or 'nothing'}; "
            f"{WRITTEN_BY} writes {WEIGHTS_FILE} and {ARCHITECTURE_FILE}, the latter last)"
        )
    return path
