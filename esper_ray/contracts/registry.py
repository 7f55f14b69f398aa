"""The registry of tasks, hosts and blueprints: a name, or a `package.module:object` import string, to a builder.

Modelled on gymnasium's `register(id, entry_point="pkg.mod:Cls")` and timm's model registry: every part is
registered under a name with an entry point that is either the object itself or an import string resolved on
first use, so every process (Ray's workers included) finds the same builder once it has imported the module
that registers it. The built-in parts register here, through the same door, with import strings: this module
imports nothing from esper_ray, and nothing is imported before a part is used.

A run names the modules that register its own parts in its `plugins` setting (EnvConfig, TrainConfig); every
EnvConfig imports them (`load_plugins`) before it looks a name up, so an env built in a Ray worker from its
env_config finds them too. Checkpoints (the TrainConfig) and saved networks (architecture.json) record them; a saved
network's are imported only when its loader passes them (load_grown's `plugins`), never on the file's word. A task
or host may also be named by its own import string (`task: my_data:load`), which registers it wherever it is
looked up.

What a builder is:
    task        `load(context) -> TaskData`, or a mapping of splits (data/task_loading.py): `context` holds the
                run's data settings (data_dir, seq_len, ...), which a plug-in's loader may ignore
    host        `build(**kwargs) -> nn.Module` with the host API of morpho/host_api.py (its slots, its topology, a
                JSON description it is rebuilt from)
    blueprint   `build(channels, multiply) -> nn.Module` for one topology (morpho/blueprints.py says what the seed
                must do at birth), under a built-in name or a new one: a new name takes the next free entry of the
                policy's blueprint vocabulary (blueprint_index), up to MAX_BLUEPRINTS
"""

from __future__ import annotations

import importlib
import importlib.util
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

LOSS_KINDS = ("classification", "tokens")
"""classification: one label per sample (y [N]); tokens: a label per position (y [N, T]), counted in tokens."""
TOPOLOGIES = ("cnn", "transformer", "vector")
"""Kinds of host (contracts/host.py Topology): which blueprints fit a slot, and the slot features' shape."""
BLUEPRINT_NAMES = (
    "conv_light",
    "attention",
    "norm",
    "depthwise",
    "bottleneck",
    "conv_small",
    "conv_heavy",
    "lora",
    "lora_large",
    "mlp_small",
    "mlp",
    "flex_attention",
)
"""The built-in blueprint names, at vocabulary indices 1..12 (contracts/actions.py Blueprint; 0 is noop)."""
MAX_BLUEPRINTS = 32
"""Entries of the blueprint vocabulary, noop and the built-ins included: the policy's blueprint head and embedding
are sized for it, so a plug-in may register up to MAX_BLUEPRINTS - 1 - len(BLUEPRINT_NAMES) new names."""

EntryPoint = str | Callable[..., Any]


@dataclass(frozen=True)
class TaskEntry:
    name: str
    entry_point: EntryPoint
    """`load(context)` -> TaskData or a mapping of splits, or its import string."""
    loss: str = "classification"
    """classification or tokens."""
    hosts: tuple[str, ...] = ()
    """The hosts made for this task, its default first. Any host that is not built in may be used with any task."""
    batch_size: int = 64
    """Training batch per env (sequences for tokens)."""
    host_lr: float = 0.05
    """Host SGD learning rate."""
    augment: bool = False
    """Random crop and flip of images on the device."""
    val_batch_size: int = 1024
    """Validation samples per fused forward chunk."""
    builtin: bool = False


@dataclass(frozen=True)
class HostEntry:
    name: str
    entry_point: EntryPoint
    """A host class, or a function returning a host, or its import string; called with `kwargs`."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    builtin: bool = False


@dataclass(frozen=True)
class BlueprintEntry:
    name: str
    topology: str
    entry_point: EntryPoint
    """`build(channels, multiply)` -> a seed module, or its import string."""
    builtin: bool = False


_TASKS: dict[str, TaskEntry] = {}
_HOSTS: dict[str, HostEntry] = {}
_BLUEPRINTS: dict[tuple[str, str], BlueprintEntry] = {}
_LOADED: set[str] = set()
_VOCABULARY: list[str] = ["noop", *BLUEPRINT_NAMES]
"""Blueprint names by vocabulary index: the built-ins, then each new name in the order it was first registered."""


def register_task(
    name: str,
    entry_point: EntryPoint,
    *,
    loss: str = "classification",
    hosts: Iterable[str] = (),
    batch_size: int = 64,
    host_lr: float = 0.05,
    augment: bool = False,
    val_batch_size: int = 1024,
    builtin: bool = False,
) -> TaskEntry:
    """Register a task under `name`. `hosts`: the hosts made for it, the default first (a run picks one with
    `host_preset`); with none, a run must name its host."""
    _check_name("task", name)
    if loss not in LOSS_KINDS:
        raise ValueError(f"task {name!r}: loss={loss!r}; choose one of {list(LOSS_KINDS)}")
    for key, value in (("batch_size", batch_size), ("val_batch_size", val_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"task {name!r}: {key}={value!r}; must be an integer >= 1")
    if isinstance(host_lr, bool) or not isinstance(host_lr, (int, float)) or not host_lr > 0:
        raise ValueError(f"task {name!r}: host_lr={host_lr!r}; must be a number > 0")
    if isinstance(hosts, str):
        raise ValueError(f"task {name!r}: hosts={hosts!r}; give a list of host names, e.g. [{hosts!r}]")
    entry = TaskEntry(name, entry_point, loss, tuple(hosts), batch_size, host_lr, augment, val_batch_size, builtin)
    return _put(_TASKS, name, entry, "task")


def register_host(name: str, entry_point: EntryPoint, *, builtin: bool = False, **kwargs: Any) -> HostEntry:
    """Register a host under `name`: `entry_point(**kwargs)` builds a fresh one (kwargs: plain values)."""
    _check_name("host", name)
    return _put(_HOSTS, name, HostEntry(name, entry_point, dict(kwargs), builtin), "host")


def register_blueprint(name: str, topology: str, entry_point: EntryPoint, *, builtin: bool = False) -> BlueprintEntry:
    """Register the builder of blueprint `name` on hosts of `topology`."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"blueprint {name!r}: topology={topology!r}; choose one of {list(TOPOLOGIES)}")
    _check_name("blueprint", name)
    if name == "noop":
        raise ValueError("blueprint name 'noop': reserved for the policy's blueprint that adds nothing; pick another")
    new = name not in _VOCABULARY
    if new and len(_VOCABULARY) >= MAX_BLUEPRINTS:
        raise ValueError(
            f"blueprint name {name!r}: the policy's blueprint vocabulary is full (MAX_BLUEPRINTS={MAX_BLUEPRINTS} "
            f"entries, noop included); register it under a name already used: {_VOCABULARY[1:]}"
        )
    entry = _put(_BLUEPRINTS, (topology, name), BlueprintEntry(name, topology, entry_point, builtin), "blueprint")
    if new:
        _VOCABULARY.append(name)
    return entry


def blueprint_index(name: str) -> int:
    """The vocabulary index of blueprint `name` in this process (its policy head entry and embedding index): the
    built-ins' are fixed; a plug-in name's follows the order the run's plug-ins registered theirs."""
    try:
        return _VOCABULARY.index(name)
    except ValueError:
        raise ValueError(
            f"blueprint {name!r}: not registered in this process; registered: {_VOCABULARY[1:]} "
            "(a plug-in's blueprint needs its module in `plugins`)"
        ) from None


def blueprint_vocabulary() -> tuple[str, ...]:
    """Every blueprint name by vocabulary index (noop first)."""
    return tuple(_VOCABULARY)


def _check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"{kind} name {name!r}: must be a non-empty string without ':' (that marks an import string)")


def _put(table: dict[Any, Any], key: Any, entry: Any, kind: str) -> Any:
    """A name is registered once; registering the same entry again (a module imported twice) is a no-op."""
    old = table.get(key)
    if old is not None and old != entry:
        raise ValueError(f"{kind} {key!r} is registered already (by {_describe(old.entry_point)}); pick another name")
    table[key] = entry
    return entry


def _describe(entry_point: EntryPoint) -> str:
    if isinstance(entry_point, str):
        return entry_point
    return f"{getattr(entry_point, '__module__', '?')}:{getattr(entry_point, '__qualname__', repr(entry_point))}"


# ---------------------------------------------------------------------------------------------------- lookup
def task(name: str) -> TaskEntry:
    """The task registered as `name`; an import string `package.module:loader` names its loader (loss
    classification, the task's defaults, no host of its own), so any process can resolve it."""
    if name not in _TASKS and _is_import_string(name):
        _put(_TASKS, name, TaskEntry(name, _imported(name, "task")), "task")
    if name not in _TASKS:
        raise ValueError(f"task={name!r}: unknown; choose one of {task_names()} (or register it: docs/plugins.md)")
    return _TASKS[name]


def host(name: str, field: str = "host") -> HostEntry:
    """The host registered as `name`; an import string `package.module:HostClass` names a host built with no
    arguments, so any process can resolve it. `field`: the setting that named it, for the error."""
    if name not in _HOSTS and _is_import_string(name):
        _put(_HOSTS, name, HostEntry(name, _imported(name, field)), "host")
    if name not in _HOSTS:
        raise ValueError(f"{field}={name!r}: unknown; choose one of {host_names()} (or register it: docs/plugins.md)")
    return _HOSTS[name]


def registered_host(name: str) -> HostEntry | None:
    """The host registered as `name` in this process, or None: never resolves an import string, so a name read
    from a file (a grown network's architecture.json) runs no code it names. `host` is for a run's own settings."""
    return _HOSTS.get(name) if isinstance(name, str) else None


def has_blueprint(topology: str, name: str) -> bool:
    """Whether blueprint `name` is registered for hosts of `topology` in this process."""
    return (topology, name) in _BLUEPRINTS


def _is_import_string(name: object) -> bool:
    return isinstance(name, str) and name.count(":") == 1 and all(name.partition(":")[::2])


def _imported(name: str, kind: str) -> Any:
    try:
        obj = resolve(name)
    except ImportError as err:
        raise ValueError(
            f"{kind}={name!r}: cannot be imported ({err}); install it or put its folder on PYTHONPATH"
        ) from None
    except ValueError as err:  # the module has no such object
        raise ValueError(f"{kind}={name!r}: {err}") from None
    if not callable(obj):
        raise ValueError(
            f"{kind}={name!r}: names a {type(obj).__name__}; expected a {'loader' if kind == 'task' else 'host class'}"
        )
    return obj


def blueprint(topology: str, name: str) -> BlueprintEntry:
    if (topology, name) not in _BLUEPRINTS:
        raise ValueError(
            f"blueprint {name!r}: not available for {topology} hosts; available: {blueprint_names(topology)}"
        )
    return _BLUEPRINTS[(topology, name)]


def task_names(*, builtin_only: bool = False) -> list[str]:
    return [n for n, e in _TASKS.items() if e.builtin or not builtin_only]


def host_names(*, builtin_only: bool = False) -> list[str]:
    return [n for n, e in _HOSTS.items() if e.builtin or not builtin_only]


def blueprint_names(topology: str) -> list[str]:
    """The blueprints registered for a topology, in the order they were registered."""
    return [n for t, n in _BLUEPRINTS if t == topology]


def hosts_for(task_name: str) -> list[str]:
    """The hosts a task may use: those made for it, then every registered host that is not built in."""
    made_for = list(task(task_name).hosts)
    return made_for + [n for n, e in _HOSTS.items() if not e.builtin and n not in made_for]


def resolve(entry_point: EntryPoint) -> Any:
    """The object an entry point names: itself, or what `package.module:attr.attr` imports to."""
    if not isinstance(entry_point, str):
        return entry_point
    module_name, _, attribute = entry_point.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attribute.split(".") if attribute else ():
        try:
            obj = obj[part] if isinstance(obj, Mapping) else getattr(obj, part)
        except (AttributeError, KeyError):
            raise ValueError(f"entry point {entry_point!r}: module {module_name} has no {attribute!r}") from None
    return obj


# --------------------------------------------------------------------------------------------------- plugins
RAY_PATH_HINT = " (Ray's workers inherit the driver's sys.path)"


def load_plugins(plugins: Iterable[str], *, field: str = "plugins", hint: str = RAY_PATH_HINT) -> None:
    """Import each plugin once per process: `package.module` registers its parts on import; `package.module:fn`
    also calls `fn()` (a register function). ValueError in one line when one cannot be imported, naming `field`
    (the setting or argument that listed it) and ending with `hint` (a run's: where Ray's workers look)."""
    for plugin in plugins:
        if plugin in _LOADED:
            continue
        if not isinstance(plugin, str) or not plugin or plugin.count(":") > 1:
            raise ValueError(
                f"{field}: {plugin!r} is not an import string; use 'package.module' or 'package.module:function'"
            )
        module_name, _, function = plugin.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(
                f"{field}: {plugin!r} cannot be imported ({err}); install it or put its folder on PYTHONPATH{hint}"
            ) from None
        except Exception as err:  # the plug-in's own code raised: one line naming where, not Python's traceback
            raise ValueError(
                f"{field}: {plugin!r} raised {type(err).__name__} on import: {err}{_raised_at(err, module_name)}"
            ) from None
        if function:
            register = getattr(module, function, None)
            if not callable(register):
                raise ValueError(f"{field}: {plugin!r}: module {module_name} has no function {function!r}")
            try:
                register()
            except Exception as err:  # as on import: one line naming the plug-in and where it raised
                raise ValueError(
                    f"{field}: {plugin!r} raised {type(err).__name__}: {err}{_raised_at(err, module_name)}"
                ) from None
        _LOADED.add(plugin)


def _raised_at(err: BaseException, module_name: str) -> str:
    """` (at FILE:LINE)`: the innermost frame of the plug-in's own module file, else the innermost frame."""
    frames = traceback.extract_tb(err.__traceback__)
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        spec = None
    origin = getattr(spec, "origin", None)
    own = [f for f in frames if origin is not None and f.filename == origin]
    frame = (own or [f for f in frames if not f.filename.startswith("<frozen")] or [None])[-1]
    return f" (at {frame.filename}:{frame.lineno})" if frame is not None else ""


# ------------------------------------------------------------------------------------------------- built-ins
def _register_builtins() -> None:
    data, image = "esper_ray.data.datasets", {"batch_size": 512, "host_lr": 0.01, "val_batch_size": 10_000}
    register_task("digits", f"{data}:digits_task", hosts=("digits",), builtin=True)
    register_task("digits-impaired", f"{data}:digits_task", hosts=("digits-impaired",), builtin=True)
    register_task("cifar10", f"{data}:cifar10_task", hosts=("cifar10",), augment=True, builtin=True, **image)
    register_task("synthetic", f"{data}:synthetic_task", hosts=("synthetic",), builtin=True, **image)
    # batch in sequences of 64 bytes (2,048 tokens); SGD (momentum 0.9) like every host, at a rate the small
    # transformer learns with in a few epochs
    register_task(
        "text",
        f"{data}:text_task",
        loss="tokens",
        hosts=("text", "text-gpu", "text-starved"),
        batch_size=32,
        host_lr=0.3,
        builtin=True,
    )
    for name in ("digits", "digits-impaired", "cifar10", "synthetic"):
        register_host(name, "esper_ray.morpho.host:CNNHost.from_preset", preset=name, builtin=True)
    for name in ("text", "text-gpu", "text-starved"):
        register_host(name, "esper_ray.morpho.transformer:TransformerHost.from_preset", preset=name, builtin=True)
    for name in ("norm", "attention", "depthwise", "bottleneck", "conv_small", "conv_light", "conv_heavy"):
        register_blueprint(name, "cnn", f"esper_ray.morpho.blueprints:CNN_BUILDERS.{name}", builtin=True)
    for name in ("norm", "attention", "lora", "lora_large", "mlp_small", "mlp", "flex_attention"):
        register_blueprint(
            name, "transformer", f"esper_ray.morpho.blueprints:TRANSFORMER_BUILDERS.{name}", builtin=True
        )
    for name in ("norm", "attention", "lora", "mlp_small", "mlp"):
        register_blueprint(name, "vector", f"esper_ray.morpho.vector_blueprints:BUILDERS.{name}", builtin=True)


_register_builtins()
