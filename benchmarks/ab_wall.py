"""Wall time of `esper-ray ab` from its start to its report, on the first G GPUs of this machine, for each G in turn.

    python benchmarks/ab_wall.py tune_configs/text.yaml --gpus 1 2 4                # as the file says
    python benchmarks/ab_wall.py tune_configs/text.yaml --gpus 1 2 --rounds 3       # the same trials, 3 PPO rounds
    python benchmarks/ab_wall.py tune_configs/text.yaml --gpus 4 --stop-after 500   # then the same command again
    python benchmarks/ab_wall.py tune_configs/controllers.yaml --gpus 0 --rounds 10 --output /tmp/abw_cpu
    python benchmarks/ab_wall.py tune_configs/controllers.yaml --gpus 1 2 --rounds 10 --gpus-per-env 0.0625 \
        --output /tmp/abw_gpu

Each G runs the experiment in its own `esper-ray ab` process that sees only the first G cards (CUDA_VISIBLE_DEVICES),
into OUTPUT/gG, so concurrency comes from those cards as it would on a G-GPU machine (`--gpus 0`: the CPUs alone).
`--rounds R` replaces the file's `rounds` (a copy of the file in OUTPUT; everything else unchanged), for a machine
that holds no full run. `--stop-after S` stops a G's run after S seconds (SIGTERM: Tune keeps every finished trial
and the rounds done), so a per-call time limit loses nothing: run the same command again and each G that has no
report yet resumes (`--resume`), the walls of its calls summed (a resume repeats the interrupted rounds, so a split
run's sum is an upper bound). `--gpus-per-env F` moves a CPU file's envs onto the GPUs (training.gpus_per_env F, shared
through MPS), to see where the CNN task's A/B is faster: with the CPUs alone (`--gpus 0`, as the file says) or with
its envs on the cards. `--warmup` first runs the experiment with 1 round, not counted, so that runs on a fresh
machine and on one that ran the task before are measured alike (warm compile caches). Progress goes to stderr; one
JSON line a G on stdout: the card and commit, the command, the wall seconds to the report over all calls, the calls,
the share of the machine's CPU time busy in each (`cpu_busy`), the wall before Tune's run started and after its last
progress line in each (`outside_tune`: Ray, MPS and the plan; the report and the exit), trials done of all, whether
the report was written, the
line in which `esper-ray ab` said how many trials it runs at once, and where the last call's wall went (`last_call`:
when its PPO trials started, each one's setup before that (Tune calls a trial started once its setup is done) with
when its env runners' processes were up and how long they took to build, its first round and the rounds after it, in
seconds, from the progress lines).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import yaml  # noqa: E402
from throughput import gpu_ids, log, machine  # noqa: E402  (a sibling script, not a package)

from esper_ray.experiments.results import FINISHED  # noqa: E402
from esper_ray.train.process.termination import EXIT_CODE as TERMINATED  # noqa: E402

AB = "import sys; from esper_ray.cli import main; sys.exit(main())"
STATE = "ab_wall.json"
INTERRUPTED = (130, TERMINATED, -signal.SIGKILL)
"""Exit codes of a run stopped part-way (Ctrl-C, SIGTERM, killed after the grace): the next call resumes it. Any
other code (0, or a run that failed) is final."""
GRACE_S = 180.0
"""How long a stopped run may take to save Tune's state and write its partial report before it is killed."""


def experiment_copy(source: Path, folder: Path, rounds: int | None = None, gpus_per_env: float | None = None) -> Path:
    """A copy of the experiment file with `rounds` replaced (and `last_rounds` no larger than it) and, with
    `gpus_per_env`, every trial's envs on that share of a GPU, shared through MPS."""
    data = yaml.safe_load(source.read_text())
    name = source.stem
    if rounds is not None:
        data["rounds"] = rounds
        if data.get("last_rounds") is not None:
            data["last_rounds"] = min(int(data["last_rounds"]), rounds)
        name += f"_rounds{rounds}"
    if gpus_per_env is not None:
        data.setdefault("training", {}).update(gpus_per_env=gpus_per_env, mps=True)
        name += f"_gpus_per_env{gpus_per_env:g}"
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / f"{name}.yaml"
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


def trials_done(output: Path) -> tuple[int, int]:
    """Finished trials and all planned trials, from the run's results.json (0, 0 before it exists)."""
    try:
        trials = json.loads((output / "results.json").read_text())["trials"]
    except (OSError, ValueError, KeyError):
        return 0, 0
    return sum(t["status"] == FINISHED for t in trials), len(trials)


def concurrency_line(log_file: Path) -> str | None:
    for line in log_file.read_text(errors="replace").splitlines():
        if line.startswith("trials at once"):
            return line
    return None


PROGRESS_LINE = re.compile(r"^\[\s*(\d+)m(\d\d)s\] (started |finished| )\s*(\S+/seed\d+)(?: round (\d+)/\d+)?")
"""`esper-ray ab`'s progress lines (experiments/runner.py, TrialEvents): the clock, the event, the trial, a round."""
SETUP = re.compile(r"; its setup (\d+) s(?: \(env runners up after (\d+) s, then built in (\d+) s\))?")
"""A trial's setup seconds, on its first round's progress line, and their split where it was printed."""
CALL_START = "esper-ray ab:"
"""The first line `esper-ray ab` prints in each call."""


def clock_seconds(progress: re.Match[str]) -> int:
    """The seconds of a PROGRESS_LINE match's clock ([ 1m05s] -> 65)."""
    return 60 * int(progress[1]) + int(progress[2])


def ppo_timeline(log_file: Path) -> dict[str, Any] | None:
    """Where the last call's wall went, from its progress lines: when its PPO trials started (seconds into the
    call), and per PPO trial (a trial with rounds) the seconds from its start to its first round and from its
    first round to its last. Only trials that started in that call count (a resumed trial's rounds began before
    it); None if there are none."""
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return None
    last_call = text.split(CALL_START)[-1]
    started: dict[str, int] = {}
    rounds: dict[str, dict[int, int]] = {}
    setups: dict[str, tuple[int, int | None, int | None]] = {}
    for line in last_call.splitlines():
        match = PROGRESS_LINE.match(line)
        if match is None:
            continue
        clock, event, trial, round_ = clock_seconds(match), match[3], match[4], match[5]
        if event == "started ":
            started[trial] = clock
        elif round_ is not None:
            rounds.setdefault(trial, {})[int(round_)] = clock
            setup = SETUP.search(line)
            if setup is not None:
                setups[trial] = (int(setup[1]), *(int(v) if v is not None else None for v in setup.groups()[1:]))
    ppo = [t for t in started if 1 in rounds.get(t, {})]
    if not ppo:
        return None
    timeline = {
        "ppo_trials_started_s": [min(started[t] for t in ppo), max(started[t] for t in ppo)],
        "ppo_first_round_s": sorted(rounds[t][1] - started[t] for t in ppo),
        "ppo_later_rounds_s": sorted(rounds[t][max(rounds[t])] - rounds[t][1] for t in ppo),
    }
    for i, key in enumerate(("ppo_setup_s", "ppo_env_runners_up_s", "ppo_env_runner_init_s")):
        values = sorted(setups[t][i] for t in ppo if t in setups and setups[t][i] is not None)
        if values:  # runs from before these were printed have none
            timeline[key] = values
    return timeline


def cpu_times(stat: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """(busy, total) time of all the machine's CPUs since boot, in clock ticks, from the first line of Linux's
    /proc/stat (user nice system idle iowait irq softirq steal ...; guest time is inside user); None elsewhere."""
    try:
        ticks = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(ticks) < 5:
        return None
    total = sum(ticks)
    return total - ticks[3] - ticks[4], total  # idle and iowait are not busy


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time that was busy between two cpu_times readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


class TuneClock:
    """Where a call's wall went outside Tune's run, from when its progress lines arrive: the progress clock starts
    with Tune's run (experiments/runner.py, TrialEvents), so a line stamped C seconds that arrives N seconds into
    the call says Tune started N - C seconds in (Ray, MPS and the plan before it); the wall after the last progress
    line is the report, the figures and the exit. Whole seconds, as the lines are stamped."""

    def __init__(self) -> None:
        self.tune_started_s: float | None = None
        self.last_event_s: float | None = None

    def see(self, line: str, seconds_into_call: float) -> None:
        match = PROGRESS_LINE.match(line)
        if match is None:
            return
        if self.tune_started_s is None:
            self.tune_started_s = round(seconds_into_call - clock_seconds(match), 1)
        self.last_event_s = seconds_into_call

    def outside(self, wall: float) -> dict[str, float] | None:
        if self.tune_started_s is None or self.last_event_s is None:
            return None
        return {"before_tune_s": self.tune_started_s, "after_last_event_s": round(wall - self.last_event_s, 1)}


def run_ab(
    experiment: Path,
    output: Path,
    visible: str,
    stop_after: float | None,
    resume: bool,
    log_file: Path,
    python: str = sys.executable,
) -> tuple[float, int, float | None, dict[str, float] | None]:
    """One `esper-ray ab` call: its wall seconds, exit code, the share of the machine's CPU time busy meanwhile
    (is the CPU what a run on more cards waits for?) and the wall before and after Tune's run (TuneClock).
    Stopped with SIGTERM after `stop_after` seconds."""
    command = [python, "-c", AB, "ab", str(experiment), "--output", str(output)] + (["--resume"] if resume else [])
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible)
    cpu_before = cpu_times()
    clock = TuneClock()
    start = time.monotonic()
    with log_file.open("a") as out:
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )

        def copy_lines() -> None:  # into the log as they come, each seen with the time it arrived
            try:
                for line in process.stdout:
                    clock.see(line, time.monotonic() - start)
                    out.write(line)
                    out.flush()
            except ValueError:  # the log closed after the join below gave up on a pipe a grandchild still holds
                return

        copier = threading.Thread(target=copy_lines, daemon=True)
        copier.start()
        try:
            code = process.wait(timeout=stop_after)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
        wall = time.monotonic() - start
        copier.join(timeout=10)  # the rest of the output; a child left holding the pipe must not hold this call
    return wall, code, busy_share(cpu_before, cpu_times()), clock.outside(wall)


def measure(
    experiment: Path, gpus: int, output: Path, stop_after: float | None, python: str = sys.executable
) -> dict[str, Any]:
    """Run (or resume) the experiment on the first `gpus` cards into `output`; the figures of all its calls."""
    output.mkdir(parents=True, exist_ok=True)
    state_file = output / STATE
    state = json.loads(state_file.read_text()) if state_file.is_file() else {"walls": [], "codes": []}
    visible = ",".join(gpu_ids(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)) if gpus else ""
    if not state["codes"] or state["codes"][-1] in INTERRUPTED:
        log(
            f"gpus {gpus} ({visible or 'CPU only'}): {'resuming' if state['walls'] else 'starting'} "
            f"{experiment} into {output} (its progress: {output / 'ab.log'})"
        )
        wall, code, cpu_busy, outside = run_ab(
            experiment,
            output / "run",
            visible,
            stop_after,
            resume=bool(state["walls"]),
            log_file=output / "ab.log",
            python=python,
        )
        state["walls"].append(round(wall, 1))
        state["codes"].append(code)
        state.setdefault("cpu_busy", []).append(cpu_busy)
        state.setdefault("outside_tune", []).append(outside)
        state_file.write_text(json.dumps(state))
    done, total = trials_done(output / "run")
    return {
        "gpus": gpus,
        "visible": visible,
        "wall_s": round(sum(state["walls"]), 1),
        "walls_s": state["walls"],
        "calls": len(state["walls"]),
        "exit_codes": state["codes"],
        "cpu_busy": state.get("cpu_busy"),
        "outside_tune": state.get("outside_tune"),
        "trials_done": done,
        "trials": total,
        "report": state["codes"][-1] == 0 and (output / "run" / "report.md").is_file(),
        "concurrency": concurrency_line(output / "ab.log"),
        "last_call": ppo_timeline(output / "ab.log"),
    }


def warm_up(
    source: Path,
    output: Path,
    gpus: int,
    gpus_per_env: float | None,
    stop_after: float | None,
    python: str = sys.executable,
) -> dict[str, Any]:
    """Run the experiment once with 1 round on `gpus` cards into `output` (not counted): the runs measured after it
    find the machine as one that ran the task before does (Inductor's and Triton's compile caches, Ray's files in
    the page cache). A fresh machine's first A/B paid about 15 s more in each PPO trial's first round and a slower
    Ray start (docs/performance.md)."""
    copy = experiment_copy(source, output, rounds=1, gpus_per_env=gpus_per_env)
    figures = measure(copy, gpus, output, stop_after, python=python)
    return {"gpus": gpus, "wall_s": figures["wall_s"], "report": figures["report"]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("experiment", type=Path, help="experiment file, e.g. tune_configs/text.yaml")
    parser.add_argument("--gpus", type=int, nargs="+", default=[1], help="GPU counts to run in turn (0: CPU only)")
    parser.add_argument("--rounds", type=int, help="replace the file's rounds (a copy of it in OUTPUT)")
    parser.add_argument(
        "--gpus-per-env",
        type=float,
        help="put every trial's envs on this share of a GPU (MPS on), in a copy of the file",
    )
    parser.add_argument("--stop-after", type=float, help="stop each run after this many seconds; run again to resume")
    parser.add_argument(
        "--output", type=Path, default=Path("/tmp/ab_wall"), help="results folder (default %(default)s)"
    )
    parser.add_argument(
        "--warmup",
        action="store_true",
        help="first run the experiment with 1 round on the most GPUs asked, into OUTPUT/warmup and not "
        "counted, so every measured run finds the compile caches warm (once per OUTPUT)",
    )
    args = parser.parse_args()
    if not args.experiment.is_file():
        parser.error(f"experiment file {args.experiment}: not found")
    if any(g < 0 for g in args.gpus):
        parser.error(f"--gpus {args.gpus}: each must be 0 or more")
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: must be 1 or more")
    if args.gpus_per_env is not None and not 0 < args.gpus_per_env < 1:
        parser.error(f"--gpus-per-env {args.gpus_per_env}: a share of one GPU, more than 0 and less than 1")
    if args.gpus_per_env is not None and 0 in args.gpus:
        parser.error("--gpus-per-env puts the envs on GPUs: --gpus 0 has none")
    experiment = args.experiment
    if args.rounds is not None or args.gpus_per_env is not None:
        experiment = experiment_copy(args.experiment, args.output, args.rounds, args.gpus_per_env)
    command = "python benchmarks/ab_wall.py " + " ".join(sys.argv[1:])
    warmup = (
        warm_up(args.experiment, args.output / "warmup", max(args.gpus), args.gpus_per_env, args.stop_after)
        if args.warmup
        else None
    )
    if warmup is not None and not warmup["report"]:
        log(f"the warm-up has not ended yet ({warmup['wall_s']} s so far): run the same command again")
        return
    for gpus in args.gpus:
        figures = measure(experiment, gpus, args.output / f"g{gpus}", args.stop_after)
        setup = {
            "experiment": str(args.experiment),
            "rounds": args.rounds,
            "gpus_per_env": args.gpus_per_env,
            "warmup": warmup,
            "command": command,
        }
        print(json.dumps({"machine": machine(), "setup": setup, **figures}), flush=True)


if __name__ == "__main__":
    main()
