"""Per-episode metrics (and the step count behind the progress bar), logged from each env runner through RLlib's
MetricsLogger (so they reach Tune and TensorBoard): final accuracy of the committed model (mean/min/max) and with the
seeds on probation, perplexity on text, the network's size at the start and end, parameters kept and on probation,
seeds per outcome (and by blueprint), op counts, CUDA graphs captured and epochs with a seed, per-phase seconds
summed over all epochs of the episode (each a mean over the round's episodes), rollbacks (a sum over the round), and
each env's GradScaler scale (min/max across envs)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from esper_ray.contracts import metrics as m
from esper_ray.contracts.actions import Op
from esper_ray.train.output.progress import StepReporter


class MorphoMetrics(RLlibCallback):
    def __init__(self) -> None:
        super().__init__()
        self.progress = StepReporter()

    def on_episode_step(self, *, env_runner: Any = None, **kwargs: Any) -> None:
        self.progress.step(env_runner)  # feeds `esper-ray train`'s bar inside a round

    def on_sample_end(self, **kwargs: Any) -> None:
        self.progress.flush()

    def on_episode_end(
        self, *, episode: Any, prev_episode_chunks: Any = None, metrics_logger: Any = None, **kwargs: Any
    ) -> None:
        chunks = [*(prev_episode_chunks or []), episode]  # `episode` is only the last chunk
        # A chunk after the first starts with its predecessor's last info (the observation it continues from):
        # count it once, or the step at a round boundary would be counted twice.
        infos = list(chunks[0].get_infos()) + [info for chunk in chunks[1:] for info in chunk.get_infos()[1:]]
        first, final = infos[0], infos[-1]
        log = metrics_logger.log_value
        # What the run keeps is the committed model (host and fossils); the seeds still on probation are logged apart.
        log(m.FINAL_ACCURACY, final["committed_accuracy"], reduce="mean")
        log(m.FINAL_ACCURACY_MIN, final["committed_accuracy"], reduce="min")
        log(m.FINAL_ACCURACY_MAX, final["committed_accuracy"], reduce="max")
        log(m.FINAL_ACCURACY_WITH_PROBATION, final["val_accuracy"], reduce="mean")
        log(m.INITIAL_ACCURACY, first["val_accuracy"], reduce="mean")
        if "val_perplexity" in final:  # only a token task has a perplexity, and only its env info carries one
            log(m.FINAL_PERPLEXITY, final["val_perplexity"], reduce="mean")
        log(m.PARAMS_ADDED, final["committed_seed_params"], reduce="mean")
        log(m.PARAMS_ON_PROBATION, final["seed_params"] - final["committed_seed_params"], reduce="mean")
        log(m.HOST_PARAMS, final["host_params"], reduce="mean")
        log(m.FINAL_PARAMS, final["host_params"] + final["committed_seed_params"], reduce="mean")
        log(m.FINAL_PARAMS_WITH_PROBATION, final["host_params"] + final["seed_params"], reduce="mean")
        log(m.SEEDS_GERMINATED, final["count/germinated"], reduce="mean")
        log(m.SEEDS_FOSSILIZED, final["count/fossilized"], reduce="mean")
        log(m.SEEDS_PRUNED, final["count/pruned"], reduce="mean")
        log(m.ROLLBACKS, final["count/rollbacks"], reduce="sum")
        log(m.EPISODES, 1, reduce="sum")
        if "family_member" in final:  # the env's info names the episode's family member
            log(f"{m.FAMILY_PREFIX}{final['family_member']}_episodes", 1, reduce="sum")
            log(f"{m.FAMILY_PREFIX}{final['family_member']}_final_accuracy", final["committed_accuracy"], reduce="mean")
        log(m.EPISODE_RETURN, sum(chunk.get_return() for chunk in chunks), reduce="mean")
        for outcome in m.BLUEPRINT_OUTCOMES:
            prefix = f"count/{outcome}/"
            for key, count in final.items():
                if key.startswith(prefix):
                    log(f"{m.BLUEPRINT_COUNT_PREFIX}{outcome}_{key.removeprefix(prefix)}", count, reduce="mean")
        ops = Counter(info["last_op"] for info in infos[1:])  # infos[0] comes from reset()
        for op in Op:
            log(m.OP_COUNT_PREFIX + op.name.lower(), ops[op.name], reduce="mean")  # per episode, like the seed counts
        log(
            m.GRAPH_CAPTURES, final["graph_captures"] - first["graph_captures"], reduce="mean"
        )  # the steps', not reset's
        log(m.SEED_EPOCHS, sum(info["seed_params"] > 0 for info in infos[1:]), reduce="mean")
        phases: Counter[str] = Counter()
        for info in infos[1:]:
            phases.update({k.removeprefix("time/"): v for k, v in info.items() if k.startswith("time/")})
        for phase, seconds in phases.items():
            log(m.PHASE_TIME_PREFIX + phase, seconds, reduce="mean")
        if "grad_scale" in final:
            log(m.GRAD_SCALE_MIN, final["grad_scale"], reduce="min")
            log(m.GRAD_SCALE_MAX, final["grad_scale"], reduce="max")
