"""RLlib's PPO torch learner with four additions: full-batch epochs, the reward normaliser, per-head entropy and
approximate KL, and an entropy bonus for the blueprint head alone; and a name of its own in Ray's dashboard.

The blueprint head's bonus (`learner_config_dict["blueprint_entropy_coeff"]`, TrainConfig.blueprint_entropy_coeff):
the loss also subtracts coeff x the masked mean of P(blueprint read) H(pi_blueprint) (P(read) detached), on top of
RLlib's bonus on the whole causal entropy.

Reward normaliser: see reward_normalizer.py; on when `learner_config_dict["reward_normalization"]` is true
(TrainConfig.reward_normalization), inserted just before GAE, its statistics saved with the learner's state.

Full-batch epochs: each of `num_epochs` passes is one gradient step on the whole round's batch of
zero-padded, whole-episode sequences. RLlib 2.60's minibatch iterator sizes minibatches in unpadded steps
but slices padded sequences (its own TODO in minibatch_utils.py), which for short batches yields empty
minibatches or minibatches holding only a masked bootstrap step (a 0/0 loss).

Its name: RLlib starts remote learners through Ray Train's WorkerGroup, which wraps a learner class that is not a
RayTrainWorker in a subclass made inside a function (`create_executable_class`), and Ray's dashboard lists that
actor as `create_executable_class.<locals>._WrappedExecutable`. A learner that is a RayTrainWorker already is used
as it is, so the dashboard lists `MorphoPPOLearner`. RayTrainWorker adds one method (running a function in the
actor) and no state; the wrapper would have added the same base in the same place of the MRO.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.connectors.learner.general_advantage_estimation import GeneralAdvantageEstimation
from ray.rllib.core.columns import Columns
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.annotations import override
from ray.train._internal.worker_group import RayTrainWorker

from esper_ray.contracts import metrics as m
from esper_ray.policy.distribution import CausalFactoredDistribution
from esper_ray.policy.slot_distribution import SlotConditionedDistribution
from esper_ray.train.process.gpu_spread import single_visible_gpu
from esper_ray.train.rllib.reward_normalizer import RewardStdNormalizer

ENTROPY_PREFIX = "entropy_"
BLUEPRINT_ENTROPY_KEY = "blueprint_entropy_coeff"
APPROX_KL_KEY = "approx_kl"
# RLlib's own `vf_explained_var` on padded [B, T] sequences is the explained variance of time step 0 only
# (torch_utils.explained_variance reduces over dim 0 and returns element [0]); this one is over every real step.
EXPLAINED_VARIANCE_KEY = "value_explained_variance"
REWARD_STD_KEY = "reward_std"
REWARD_NORMALIZER_STATE = "reward_normalizer"


class MorphoPPOLearner(PPOTorchLearner, RayTrainWorker):  # RayTrainWorker: the actor's name (module docstring)
    @override(PPOTorchLearner)
    def build(self) -> None:
        super().build()
        self.reward_normalizer: RewardStdNormalizer | None = None
        if self.config.learner_config_dict.get("reward_normalization", False) and self._learner_connector is not None:
            self.reward_normalizer = RewardStdNormalizer()
            self._learner_connector.insert_before(GeneralAdvantageEstimation, self.reward_normalizer)
        gpu = single_visible_gpu() if self._device.type == "cuda" and self.config.num_learners <= 1 else None
        self._gpu_id = float(gpu) if gpu is not None and gpu.isdigit() else None
        """The GPU it updates on, as a number for the metrics (m.LEARNER_GPU); None for several learners, whose
        metrics RLlib averages."""

    @override(PPOTorchLearner)
    def get_state(self, components: Any = None, *, not_components: Any = None, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(components, not_components=not_components, **kwargs)
        if self.reward_normalizer is not None and self._check_component(
            REWARD_NORMALIZER_STATE, components, not_components
        ):
            state[REWARD_NORMALIZER_STATE] = self.reward_normalizer.get_state()
        return state

    @override(PPOTorchLearner)
    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if self.reward_normalizer is not None and REWARD_NORMALIZER_STATE in state:
            self.reward_normalizer.set_state(state[REWARD_NORMALIZER_STATE])

    @override(PPOTorchLearner)
    def _create_iterator_if_necessary(self, *, num_epochs: int = 1, **kwargs: Any) -> list[Any]:
        kwargs.update(minibatch_size=None, num_total_minibatches=0, shuffle_batch_per_epoch=False)
        (whole_batch,) = list(super()._create_iterator_if_necessary(num_epochs=1, **kwargs))
        return [whole_batch] * num_epochs

    @override(PPOTorchLearner)
    def compute_loss_for_module(
        self, *, module_id: str, config: Any, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        loss = super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        mask = batch[Columns.LOSS_MASK]  # present: the module is stateful, so sequences are padded
        dist = (
            self.module[module_id]
            .unwrapped()
            .get_train_action_dist_cls()
            .from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        )
        assert isinstance(dist, (CausalFactoredDistribution, SlotConditionedDistribution)), type(dist)

        def masked_mean(x: torch.Tensor) -> torch.Tensor:
            return x[mask].mean()

        loss = loss - blueprint_entropy_bonus(
            dist, mask, self.config.learner_config_dict.get(BLUEPRINT_ENTROPY_KEY, 0.0)
        )
        with torch.no_grad():
            log_ratio = dist.logp(batch[Columns.ACTIONS]) - batch[Columns.ACTION_LOGP]
            # Schulman's unbiased estimator of KL(old || new): E[(r - 1) - log r], http://joschu.net/blog/kl-approx.html
            metrics = {APPROX_KL_KEY: masked_mean(torch.exp(log_ratio) - 1 - log_ratio)}
            module = self.module[module_id].unwrapped()
            values = module.compute_values(batch, embeddings=fwd_out[Columns.EMBEDDINGS])[mask]  # type: ignore[attr-defined]
            targets = batch[Postprocessing.VALUE_TARGETS][mask]
            # nan when the targets do not vary (CleanRL's convention), never a made-up value
            metrics[EXPLAINED_VARIANCE_KEY] = 1 - torch.var(targets - values) / torch.var(targets)
            for name, value in dist.head_entropies().items():
                metrics[ENTROPY_PREFIX + name] = masked_mean(value)
            if self.reward_normalizer is not None:
                metrics[REWARD_STD_KEY] = torch.tensor(self.reward_normalizer.running.std)
            if self._gpu_id is not None:
                metrics[m.LEARNER_GPU] = torch.tensor(self._gpu_id)
            self.metrics.log_dict(metrics, key=module_id, window=1)
        return loss


def blueprint_entropy_bonus(
    dist: CausalFactoredDistribution | SlotConditionedDistribution, mask: torch.Tensor, coeff: float
) -> torch.Tensor:
    """coeff x the mean over real steps of P(blueprint read) H(pi_blueprint): what the loss subtracts (0 if coeff is
    0)."""
    if not coeff:
        return torch.zeros((), device=mask.device)
    return coeff * dist.argument_entropy("blueprint")[mask].mean()
