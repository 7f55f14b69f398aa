"""What a trained PPO policy would do along a scripted seed lifecycle: at every step of an episode in which a
chosen blueprint is planted at epoch 0 and carried to FOSSILIZE (the fixed arm's lifecycle), the policy's own
probabilities of WAIT, PRUNE, ADVANCE and FOSSILIZE on that slot, its critic's value, and at the first step which
blueprint it would germinate. Nothing is trained; the policy only watches.

Issue 30 asked why PPO on text learns to plant and prune even where one seed is worth far more than the episode
noise: this shows whether the policy tells the seed worth keeping from the others while they train (TRAINING
shows no contribution yet: the seed is not blended in), and whether its critic values the planted seed.

    python measurements/policy_probe.py --trial RUN/tune/ppo_seed4_... --blueprints attention norm mlp --steps 16

`--trial` is an A/B trial's folder (its params.json and checkpoint_*) or an `esper-ray train` output folder (its
checkpoints/); the latest checkpoint unless `--checkpoint`. The env is the run's own (task, host, data shard 0),
on `--device`. `--steps 1` shows only the first decision (the blueprint it would plant), at the cost of one reset.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from blueprint_returns import Plan, PlanController  # noqa: E402
from ray.rllib.core.columns import Columns  # noqa: E402
from scipy.special import softmax  # noqa: E402

from esper_ray.contracts.actions import Blueprint, Op, decode_joint, encode_joint, parse_blueprint, topology_blueprints  # noqa: E402
from esper_ray.contracts.controllers import FixedSeed  # noqa: E402
from esper_ray.contracts.train_config import TrainConfig  # noqa: E402
from esper_ray.env.masks import head_offsets  # noqa: E402
from esper_ray.env.morphogenetic_env import MorphogeneticEnv  # noqa: E402
from esper_ray.env.observation import SLOT_FEATURES, decode_stage, slot_offset  # noqa: E402
from esper_ray.experiments.trainable import train_config_of  # noqa: E402
from esper_ray.morpho.hosts import topology_of  # noqa: E402
from esper_ray.train.commands.evaluate import EVAL_SEED_STRIDE, load_policy, policy_batch  # noqa: E402
from esper_ray.train.folders.checkpoints import load_checkpoint_config, resolve_checkpoint  # noqa: E402

OPS = (Op.WAIT, Op.PRUNE, Op.ADVANCE, Op.FOSSILIZE)


def run_of(trial: Path, checkpoint: Path | None) -> tuple[TrainConfig, Path]:
    """The run's training settings and the checkpoint to load: an A/B trial (params.json, checkpoint_*) or a
    training output folder (checkpoints/, each checkpoint holding its train_config.json)."""
    if (trial / "params.json").is_file():
        found = sorted(trial.glob("checkpoint_*"))
        if checkpoint is None and not found:
            raise SystemExit(f"--trial {trial}: no checkpoint_* folder in it")
        return train_config_of(json.loads((trial / "params.json").read_text())), checkpoint or found[-1]
    try:
        chosen = resolve_checkpoint(checkpoint or trial)
        return load_checkpoint_config(chosen), chosen
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(
            f"--trial {trial}: neither an A/B trial's folder (params.json) nor a training run's ({err})"
        ) from None


class Watcher:
    """The policy and its critic on each observation, the LSTM state carried as in an episode."""

    def __init__(self, checkpoint: Path) -> None:
        self.module, self.filter = load_policy(checkpoint)
        self.state = {k: torch.as_tensor(v)[None] for k, v in self.module.get_initial_state().items()}

    def look(self, obs: dict) -> tuple[np.ndarray, float]:  # type: ignore[type-arg]
        batch = policy_batch(self.filter, obs, self.state)
        with torch.no_grad():
            out = self.module.forward_train(batch)
            value = float(self.module.compute_values(batch, out[Columns.EMBEDDINGS]).reshape(-1)[0])
        self.state = out[Columns.STATE_OUT]
        return out[Columns.ACTION_DIST_INPUTS][0, 0].numpy(), value


def probe(cfg: TrainConfig, checkpoint: Path, blueprint: str, slot: str, steps: int, device: str) -> dict:  # type: ignore[type-arg]
    env_config = {**cfg.env_config(shard=0, num_shards=cfg.envs), "device": device}
    env = MorphogeneticEnv(env_config)
    topology = topology_of(cfg.task)
    seed = FixedSeed(parse_blueprint(blueprint, topology_blueprints(topology), topology), slot)
    controller = PlanController(Plan(blueprint, slot=slot), list(env.slot_ids), cfg.max_epochs, seed)
    watcher = Watcher(checkpoint)
    n = len(env.slot_ids)
    index = list(env.slot_ids).index(slot)
    offsets = head_offsets()
    obs, _ = env.reset(seed=EVAL_SEED_STRIDE * (cfg.seed + 1))
    rows, first_choice = [], {}
    for t in range(steps):
        logits, value = watcher.look(obs)
        joint = softmax(logits[offsets["op_slot"]])
        if t == 0:
            germinate = sum(joint[encode_joint(Op.GERMINATE, i)] for i in range(n))
            bp = softmax(logits[offsets["blueprint"]])
            first_choice = {
                "germinate": float(germinate),
                "blueprint": {Blueprint(i).key: round(float(p), 3) for i, p in enumerate(bp) if p > 1e-3},
            }
        block = obs["features"][slot_offset(index) : slot_offset(index) + SLOT_FEATURES]
        row = {"step": t, "stage": decode_stage(block).name, "value": round(value, 3)}
        for op in OPS:
            row[op.name.lower()] = round(float(joint[0] if op is Op.WAIT else joint[encode_joint(op, index)]), 3)
        others = sorted(((float(joint[j]), *decode_joint(j)) for j in range(1, len(joint))), key=lambda o: -o[0])
        row["other_slots"] = {
            f"{op.name.lower()}@{env.slot_ids[i]}": round(p, 3)
            for p, op, i in [o for o in others if o[2] != index and o[2] < n][:2]
            if p >= 0.01
        }
        rows.append(row)
        obs, _, terminated, truncated, _ = env.step(controller.act(obs))
        if terminated or truncated:
            break
    return {"blueprint": blueprint, "slot": slot, "first_step": first_choice, "steps": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--trial", type=Path, required=True, help="an A/B trial's folder or an `esper-ray train` output folder"
    )
    parser.add_argument("--checkpoint", type=Path, help="default: the run's latest checkpoint")
    parser.add_argument("--blueprints", nargs="+", default=["attention", "norm"])
    parser.add_argument("--slot", default="r0c0")
    parser.add_argument(
        "--steps", type=int, default=16, help="steps to watch (the fixed lifecycle fossilizes at 14-15)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cfg, checkpoint = run_of(args.trial, args.checkpoint)
    results = []
    for blueprint in args.blueprints:
        result = probe(cfg, checkpoint, blueprint, args.slot, args.steps, args.device)
        results.append(result)
        print(
            f"{blueprint}@{args.slot}; step 0: P(germinate) {result['first_step']['germinate']:.3f}, "
            f"blueprint if germinating {result['first_step']['blueprint']}"
        )
        print("  step stage       value   wait  prune advance fossilize  elsewhere")
        for r in result["steps"]:
            print(
                f"  {r['step']:4d} {r['stage']:<10} {r['value']:7.2f} {r['wait']:6.3f} {r['prune']:6.3f} "
                f"{r['advance']:7.3f} {r['fossilize']:9.3f}  {r['other_slots']}"
            )
    if args.json:
        args.json.write_text(
            json.dumps({"trial": str(args.trial), "checkpoint": checkpoint.name, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
