"""Join or start Ray, and check what a run asks for (CPUs, GPUs, memory) against what is there, before any actor
starts: a run that cannot fit is refused with a message that says what would fit, instead of Ray starting
workers and killing them for memory (seen: `--envs 1000` started 182 workers on 2 CPUs).

On a local Ray the check refuses. On a cluster joined with `--address`, resources can still arrive (the
autoscaler adds nodes for pending actors), so a shortfall is a warning.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import ray

from esper_ray.contracts.train_config import TrainConfig
from esper_ray.train.process.gpu_spread import NODE_GPUS_ENV
from esper_ray.train.process.reaper import end_ray_processes_with_this_one

GB = 1024**3
ACTOR_MEMORY_GB = 0.7
"""Resident memory of one env-runner or learner process: a Ray worker with torch, RLlib and its env (measured
0.60 GB on CPU with the digits task); data shards add to it."""
CONNECT_TIMEOUT_S = 10
VERBOSE_ENV = "ESPER_RAY_VERBOSE"  # set by `esper-ray --verbose`
LOG_LEVEL_NOTICE = "Set ray log level from environment variable"
"""What Ray's core worker prints to stderr, at any level, whenever RAY_BACKEND_LOG_LEVEL is set."""


@dataclass(frozen=True)
class Demand:
    cpus: float
    gpus: float
    memory_gb: float
    actors: int


def demand_of(cfg: TrainConfig) -> Demand:
    """What the run's actors ask Ray for (learners=0 runs the learner in this process)."""
    runners = cfg.env_runners  # cpus_per_env and gpus_per_env are each runner's, whatever envs it steps
    actors = runners + cfg.learners
    return Demand(
        cpus=runners * cfg.cpus_per_env + cfg.learners * cfg.effective_learner_cpus,
        gpus=runners * cfg.gpus_per_env + cfg.learners * cfg.learner_gpus,
        memory_gb=actors * ACTOR_MEMORY_GB,
        actors=actors,
    )


def connect_ray(
    address: str | None, log: Callable[[str], None] = print, env_vars: dict[str, str] | None = None
) -> None:
    """Join `address` (auto or HOST:PORT) or start a local Ray with this machine's CPUs; `env_vars` reach every
    worker of the job (the MPS pipe folder, say).

    Quiet unless ESPER_RAY_VERBOSE is set: no worker output forwarded (deprecation warnings, "install gputil",
    core-worker lines) and Ray's own loggers at ERROR. Errors of actors still arrive, as exceptions.
    """
    if ray.is_initialized():
        return
    verbose = os.environ.get(VERBOSE_ENV) == "1"
    quiet: dict[str, object] = {} if verbose else {"log_to_driver": False, "logging_level": logging.ERROR}
    env_vars = dict(env_vars or {})
    if address is None and os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        env_vars[NODE_GPUS_ENV] = os.environ["CUDA_VISIBLE_DEVICES"]  # the local Ray's GPU ids (gpu_spread.py)
    if env_vars:
        quiet["runtime_env"] = {"env_vars": env_vars}
    if not verbose:
        quiet_ray_logs()
        # The core worker writes error-level lines straight to stderr (e.g. that RLlib's restartable env runners
        # keep their constructor arguments in the object store); they stay in Ray's log files.
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    quiet_start = contextlib.nullcontext() if verbose else native_stderr_without(LOG_LEVEL_NOTICE)
    if address is None:
        # "local": a new local Ray even where `ray start` recorded a cluster (/tmp/ray/ray_current_cluster, also
        # written while a ray.cluster_utils.Cluster runs) or RAY_ADDRESS names one; with None, ray.init would join
        # it and refuse num_cpus ("When connecting to an existing cluster, num_cpus ... must not be provided").
        # Joining a cluster is what --address is for.
        with quiet_start, ray_processes_in_their_own_session():
            context = ray.init(address="local", num_cpus=os.cpu_count() or 1, **quiet)  # type: ignore[arg-type]
        end_ray_processes_with_this_one()  # the local Ray this command started ends with it, even on kill -9
        log(dashboard_line(context.dashboard_url, token_auth_enabled()))
        return
    check_reachable(address)
    try:
        with quiet_start:
            context = ray.init(address=address, **quiet)  # type: ignore[arg-type]
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"--address {address}: no Ray cluster answered ({first}); start one with `ray start --head`, "
            f"or leave --address out to start a local Ray"
        ) from None
    log(dashboard_line(context.dashboard_url, token_auth_enabled()))


@contextlib.contextmanager
def ray_processes_in_their_own_session() -> Iterator[None]:
    """Within (while ray.init starts a local Ray): the processes Ray starts (GCS, raylet, dashboard, monitors; the
    raylet's agents and workers under it) start in a session of their own, not in this command's process group.
    A signal sent to the command's group then reaches the command alone, as a signal to its pid does.

    On Linux Ray ties these processes to the driver through the kernel (a parent-death signal) and leaves them in
    the driver's process group. `timeout -s TERM` sends its SIGTERM to the command and then to its whole group
    (so do `kill -TERM -PGID` and a shell's `kill %1`): the GCS and the raylet shut down while Tune was stopping;
    the trials failed (`OSError: Broken pipe` to the raylet) and 60 s later the driver's core worker ended the
    process ("Failed to connect to GCS within 60 seconds") before Python's `finally` ran, so `esper-ray ab` left
    no tune_files.json and `--resume` refused the run. (Ray blocks SIGINT in these processes: Ctrl-C, which a
    terminal sends to the whole foreground group, always reached the driver alone.) They still end with this
    process: the parent-death signal does not depend on groups or sessions, and reaper.py ends its descendants.

    Elsewhere Ray makes the driver a process group leader itself and its reaper ends that group when the driver
    dies, so its processes stay in it. Ray's launcher is private API: ray is pinned (pyproject.toml), and
    tests/test_experiments.py checks that none of the command's Ray processes is left in its process group.
    """
    if not sys.platform.startswith("linux"):
        yield
        return
    from ray._private import services

    launcher = services.ConsolePopen

    class OwnSession(launcher):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs["start_new_session"] = True  # setsid() in the child, before Ray's own preexec_fn
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSession
    try:
        yield
    finally:
        services.ConsolePopen = launcher


RAY_LOGGERS = ("ray", "ray.rllib", "ray.tune", "ray.train")
"""Ray's loggers that set their own level when Ray is imported (ray.rllib at WARNING); the others inherit "ray"'s."""


def quiet_ray_logs() -> None:
    """Ray's own warnings off this process's console, unless ESPER_RAY_VERBOSE is set (`esper-ray --verbose`):
    its loggers at ERROR and the Python warnings its modules raise ignored. esper-ray's own warnings stay.

    Ray configures its loggers when imported, so call this after `import ray` (this module imports it). RLlib's
    deprecation notices are log lines, not Python warnings: every `eval` printed "DeprecationWarning:
    `RLModule(config=[RLModuleConfig object])` has been deprecated", from Ray's own RLModule constructor.
    Worker processes need nothing here: without --verbose their output is not forwarded (`log_to_driver`).
    """
    if os.environ.get(VERBOSE_ENV) == "1":
        return
    for name in RAY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"ray(\.|$)")


@contextlib.contextmanager
def native_stderr_without(marker: str) -> Iterator[None]:
    """Hold what this process writes to file descriptor 2 (C++ included) and pass it on afterwards, less the
    lines that contain `marker`.

    Ray's core worker announces the log level it read from RAY_BACKEND_LOG_LEVEL on stderr whatever that level
    is, once, while ray.init() connects; the variable itself keeps its error-level lines off the console.
    Ray's own processes (GCS, raylet, workers) write to their log files, not to the stderr they inherit.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if marker not in line))
            sys.stderr.flush()


def token_auth_enabled() -> bool:
    """Whether the Ray cluster just joined asks for a token (Ray 2.60 turns it on for a new local cluster unless
    RAY_AUTH_MODE=disabled)."""
    from ray._private.authentication.authentication_utils import is_token_auth_enabled  # no public API says this

    return is_token_auth_enabled()


def dashboard_line(url: str | None, token_auth: bool) -> str:
    """Where the dashboard is, and how to get past its "Authentication Token Required" page when the cluster
    uses token authentication (the page's sign-in box takes the token and keeps it in a cookie)."""
    if not url:
        return "Ray dashboard: not running (install it with: pip install -e '.[dashboard]')"
    line = f"Ray dashboard: http://{url}" if "://" not in url else f"Ray dashboard: {url}"
    if token_auth:
        line += (
            " (it asks for a token: paste the output of `ray get-auth-token` into its sign-in box, "
            "or send it as the ray-authentication-token cookie)"
        )
    return line


def check_reachable(address: str) -> None:
    """A HOST:PORT that nothing listens on fails in seconds here, not after minutes of Ray's retries."""
    if address == "auto":
        return  # Ray finds the local cluster itself and says at once when there is none
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--address {address!r}: expected auto or HOST:PORT, e.g. 10.0.0.5:6379")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise ValueError(
            f"--address {address}: no Ray cluster answered ({err.strerror or err}); start one with "
            f"`ray start --head`, or leave --address out to start a local Ray"
        ) from None


def check_fits(cfg: TrainConfig, local: bool, log: Callable[[str], None] = print) -> None:
    """Refuse (local Ray) or warn (a cluster that may still grow) when the run asks for more than is there."""
    want = demand_of(cfg)
    have = ray.cluster_resources()
    have_cpus, have_gpus = have.get("CPU", 0.0), have.get("GPU", 0.0)  # "GPU" is absent without GPUs
    have_memory_gb = have.get("memory", 0.0) / GB
    problems = []
    if want.cpus > have_cpus + 1e-9:
        per_env = cfg.cpus_per_env
        fits = max(0, math.floor((have_cpus - cfg.learners * cfg.effective_learner_cpus) / per_env + 1e-9))
        problems.append(
            f"{cfg.env_runners} env runners x cpus_per_env={per_env:g} + "
            f"{cfg.learners} learner(s) x {cfg.effective_learner_cpus:g} CPU "
            f"ask for {want.cpus:g} CPUs and {have_cpus:g} are there: at most {fits} env runners fit, or lower "
            "--cpus-per-env "
            f"to {max(have_cpus - cfg.learners * cfg.effective_learner_cpus, 0) / max(cfg.env_runners, 1):.2g}"
        )
    if want.gpus > have_gpus + 1e-9:
        problems.append(
            f"gpus_per_env={cfg.gpus_per_env:g} with {cfg.env_runners} env runners and "
            f"learner_gpus={cfg.learner_gpus:g} with "
            f"{cfg.learners} learner(s) ask for {want.gpus:g} GPUs and {have_gpus:g} are there: lower --gpus-per-env "
            f"(0.25 puts four envs on a GPU), use fewer --envs, or join a cluster with GPUs (--address)"
        )
    if have_memory_gb and want.memory_gb > have_memory_gb:
        fits = max(0, math.floor(have_memory_gb / ACTOR_MEMORY_GB) - cfg.learners)
        problems.append(
            f"{want.actors} actors ({cfg.env_runners} env runners, {cfg.learners} learner(s)) "
            f"need about {want.memory_gb:.1f} GB "
            f"({ACTOR_MEMORY_GB} GB each) and Ray has {have_memory_gb:.1f} GB for them: at most {fits} envs fit"
        )
    if not problems:
        return
    if local:
        raise ValueError("this run does not fit this machine: " + "; ".join(problems))
    log(
        "warning: the cluster has too little for this run right now; it waits for the autoscaler to add nodes: "
        + "; ".join(problems)
    )
