"""Keep an A/B's trained controllers: each seed's last checkpoint of one PPO arm, cut down to what `eval`, `grow` and a
`checkpoint` arm read (the policy module and the observation filter), with the trial's settings and a manifest, so
each is a checkpoint as `esper-ray train` writes one (docs/results/grow_family/controllers/seedS).

    python -m esper_ray.experiments.kept_controllers OUTPUT ARM DEST     # OUTPUT: an `esper-ray ab` folder

The optimizer's state, the learner group's and the env runner's other connectors are left behind: a frozen controller
never trains again, and they are most of a checkpoint's bytes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from esper_ray.contracts.train_config import TrainConfig
from esper_ray.experiments.spec import ExperimentSpec
from esper_ray.experiments.trial_split import recorded_split, with_split
from esper_ray.train.commands.evaluate import ENV_TO_MODULE_PATH
from esper_ray.train.folders.checkpoints import TRAIN_CONFIG_FILE, TRIAL_ROUND_FILE, resolve_checkpoint
from esper_ray.train.folders.manifest import MANIFEST_FILE, write_manifest
from esper_ray.train.rllib.rounds import MODULE_PATH

KEPT = (MODULE_PATH, ENV_TO_MODULE_PATH, Path(TRIAL_ROUND_FILE))
"""What a kept controller holds of its trial's checkpoint (beside train_config.json and files.json)."""


def last_checkpoint(trial_folder: Path) -> Path:
    """A Tune trial folder's newest checkpoint_NNNNNN."""
    checkpoints = sorted(trial_folder.glob("checkpoint_*"), key=lambda p: int(p.name.rpartition("_")[2]))
    if not checkpoints:
        raise ValueError(f"{trial_folder}: holds no checkpoint_NNNNNN folder (did its trial train?)")
    return checkpoints[-1]


def keep_controllers(output: Path, arm: str, dest: Path) -> list[Path]:
    """Copy each seed's last checkpoint of `arm` from the `esper-ray ab` folder `output` to dest/seedS, cut down
    (KEPT), with the trial's TrainConfig; returns the folders written. Refuses a dest/seedS that exists."""
    record = json.loads((output / "experiment.json").read_text())
    spec = ExperimentSpec.from_mapping(record["experiment"])
    spec = with_split(spec, recorded_split(record, spec))  # each trial's envs as it ran them
    trials = [t for t in spec.trials() if t.arm == arm]
    if not trials:
        raise ValueError(f"arm={arm!r}: not an arm of {output}; arms: {list(spec.arms)}")
    written = []
    for trial in trials:
        folders = sorted((output / "tune").glob(f"{arm}_seed{trial.seed}_*"))
        if len(folders) != 1:
            raise ValueError(f"{output / 'tune'}: expected one trial folder of {arm} seed {trial.seed}: {folders}")
        source, target = last_checkpoint(folders[0]), dest / f"seed{trial.seed}"
        if target.exists():
            raise ValueError(f"{target}: exists already; keep controllers into a new folder")
        for part in KEPT:
            if (source / part).is_dir():
                shutil.copytree(source / part, target / part)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source / part, target / part)
        (target / TRAIN_CONFIG_FILE).write_text(json.dumps(TrainConfig.from_mapping(trial.train).to_dict(), indent=2))
        (target / MANIFEST_FILE).unlink(missing_ok=True)
        write_manifest(target)
        resolve_checkpoint(target)  # complete, as eval and grow will check it
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m esper_ray.experiments.kept_controllers", description=__doc__)
    parser.add_argument("output", type=Path, help="an `esper-ray ab` output folder")
    parser.add_argument("arm", help="its PPO arm whose controllers to keep, e.g. ppo")
    parser.add_argument("dest", type=Path, help="the folder that gets seedS/ for each seed")
    args = parser.parse_args(argv)
    try:
        for folder in keep_controllers(args.output, args.arm, args.dest):
            print(f"kept {folder}")
    except (OSError, ValueError) as err:
        print(f"kept_controllers: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
