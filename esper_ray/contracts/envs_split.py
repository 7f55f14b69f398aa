"""How a run's envs are split into env-runner processes (TrainConfig.envs_per_runner, issue 77).

A run has `envs` envs, env i on data shard i of `envs`; they run as R env runners of N envs each (R x N = envs), a
runner's N envs as one vector env whose CPU hosts train stacked (env/vector_env.py). The split changes no episode:
shards, the episodes of a round and each env's round seeds (from seed, shard, round and episode) are those of
the unsplit run. `auto` (the default) picks N by the rule below; an integer sets it.

On a CPU one process stepping N envs stacked beats N processes stepping one each in turn (benchmarks/vector_env.py,
one thread, digits-impaired: 1.5-1.9x at N = 4, 1.9-2.4x at 8, 2.1-2.7x at 16), but separate processes run in
parallel on separate cores. So with E envs on C cores: E <= C keeps one env per process (N = 1); otherwise R is the
largest divisor of E that is at most C, so the processes still fill the cores and each steps E / R envs stacked.
On a GPU auto keeps one env a process (measured: the comment in auto_envs_per_runner).
"""

from __future__ import annotations

from typing import Any

AUTO = "auto"


def auto_envs_per_runner(total_envs: int, cores: float, on_gpu: bool) -> int:
    """N, the envs of each env runner, for `total_envs` envs on `cores` CPU cores (at least one counted)."""
    if on_gpu:
        # On CUDA one env a process replaying its own graphs is faster: a held stack's graphs are captured again
        # whenever any member's seeds change, so 4 stacked envs captured in 0.78 of their steps (one alone 0.28) and
        # their eager steps kept a core busy; --lead at 12 envs an H100 made 421k samples/s as 3 x 4, 536k as 6 x 2,
        # 934k as 12 x 1 (docs/design.md, "Many hosts per process", the device's measure).
        return 1
    usable = max(1, int(cores + 1e-9))
    runners = max(r for r in range(1, min(total_envs, usable) + 1) if total_envs % r == 0)
    return total_envs // runners


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_envs_per_runner(value: Any, envs: Any) -> None:
    """One line naming the value and what is allowed: 'auto' or a positive integer that divides `envs`."""
    if value == AUTO:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"envs_per_runner={value!r}: must be a positive integer that divides envs, or 'auto'")
    if isinstance(envs, int) and not isinstance(envs, bool) and envs >= 1 and envs % value:
        raise ValueError(
            f"envs_per_runner={value}: must divide envs={envs} (one of {divisors(envs)}), or be 'auto'; "
            "envs counts the run's envs, and each env runner steps envs_per_runner of them"
        )


def auto_why(cores: float, on_gpu: bool) -> str:
    """Why auto split as it did, in a few words."""
    return "auto: envs on GPUs" if on_gpu else f"auto: {cores:g} CPU core{'' if cores == 1 else 's'}"


def split_line(envs: int, per_runner: int, why: str | None = None) -> str:
    """How a run's envs run: "16 envs as 2 env runners x 8 (auto: 2 CPU cores)"; "2 envs" unsplit, said why when
    auto chose it."""

    def count(n: int, noun: str) -> str:
        return f"{n} {noun if n == 1 else noun + 's'}"

    runners = envs // per_runner
    what = (
        count(envs, "env")
        if per_runner == 1
        else f"{count(envs, 'env')} as {count(runners, 'env runner')} x {per_runner}"
    )
    return f"{what} ({why})" if why else what
