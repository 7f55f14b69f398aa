"""Which seeds a trained PPO policy plants, and which its run keeps: every slot's seed in greedy episodes of the
run's own evaluation settings (blueprint, the step it was germinated, the step it was fossilized or its stage at
the end). An A/B report gives what was kept in total (parameters, fossils); this says where and when.

Issue 30 asked why PPO trails the host born with the best seed on digits-impaired: run on every PPO trial of
tune_configs/studies/step_and_batch.yaml, it showed each policy planting that very seed at step 1 and then a second
seed too late to be fossilized (docs/history.md, Learning section 8).

    python measurements/kept_seeds.py --trial RUN/tune/ppo_lr_3e-4_seed203_... [--episodes 1] [--json out.json]

`--trial` as in policy_probe.py: an A/B trial's folder or an `esper-ray train` output folder (its latest checkpoint
unless `--checkpoint`). The episodes are the run's evaluation episodes (same env settings and reset seeds), on
`--device`; a re-run from the checkpoint, so its accuracies need not equal the A/B's own evaluation to the digit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from policy_probe import run_of  # noqa: E402

from esper_ray.env.morphogenetic_env import MorphogeneticEnv  # noqa: E402
from esper_ray.train.commands.episodes import EpisodeHistory, EpisodeSummary  # noqa: E402
from esper_ray.train.commands.evaluate import (
    GreedyPolicyController,
    evaluation_episodes,
    load_policy,
    run_evaluation_episodes,
)  # noqa: E402


def seeds_of(env: MorphogeneticEnv, history: EpisodeHistory) -> list[dict[str, Any]]:
    """The latest seed of every slot that held one: blueprint (None once pruned), germinated and fossilized step,
    stage at the end."""
    assert env.model is not None
    out = []
    for slot, events in sorted(history.seeds.items(), key=lambda kv: kv[1].germinated_epoch):
        seed = env.model.slots[slot]
        out.append(
            {
                "slot": slot,
                "blueprint": seed.blueprint.key if seed.blueprint is not None else None,
                "germinated": events.germinated_epoch,
                "fossilized": events.fossilized_epoch,
                "stage": seed.stage.name,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--trial", type=Path, required=True, help="an A/B trial's folder or an `esper-ray train` output folder"
    )
    parser.add_argument("--checkpoint", type=Path, help="default: the run's latest checkpoint")
    parser.add_argument("--episodes", type=int, default=1, help="the run's first N evaluation episodes (default 1)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cfg, checkpoint = run_of(args.trial, args.checkpoint)
    module, feature_filter = load_policy(checkpoint)
    plan = [
        dataclasses.replace(e, env_config={**e.env_config, "device": args.device})
        for e in evaluation_episodes(cfg, args.episodes)
    ]
    episodes: list[dict[str, Any]] = []

    def record(env: MorphogeneticEnv, summary: EpisodeSummary, history: EpisodeHistory) -> None:
        episodes.append(
            {
                "episode": summary.episode,
                "test_accuracy": summary.test_accuracy,
                "params_added": summary.params_added,
                "germinated": summary.germinated,
                "fossilized": summary.fossilized,
                "pruned": summary.pruned,
                "seeds": seeds_of(env, history),
            }
        )
        seeds = ", ".join(
            f"{s['blueprint'] or 'pruned'}@{s['slot']} step {s['germinated']}"
            + (f"-{s['fossilized']} fossilized" if s["fossilized"] else f" {s['stage'].lower()} at the end")
            for s in episodes[-1]["seeds"]
        )
        print(
            f"episode {summary.episode}: test acc {summary.test_accuracy:.4f}, +{summary.params_added} params kept; "
            f"{seeds or 'no seed'}",
            flush=True,
        )

    run_evaluation_episodes(plan, GreedyPolicyController(module, feature_filter), on_episode_end=record)
    if args.json:
        args.json.write_text(
            json.dumps({"trial": str(args.trial), "checkpoint": checkpoint.name, "episodes": episodes}, indent=1)
        )


if __name__ == "__main__":
    main()
