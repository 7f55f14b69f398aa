"""RLlib's PPO torch learner with two additions: full-batch epochs, and per-head entropy and approximate KL.

Full-batch epochs: each of `num_epochs` passes is one gradient step on the whole round's batch of
zero-padded, whole-episode sequences. RLlib 2.60's minibatch iterator sizes minibatches in unpadded steps
but slices padded sequences (its own TODO in minibatch_utils.py), which for short batches yields empty
minibatches or minibatches holding only a masked bootstrap step (a 0/0 loss).
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.utils.annotations import override

from esper_ray.policy.distribution import CausalFactoredDistribution

ENTROPY_PREFIX = "entropy_"
APPROX_KL_KEY = "approx_kl"


class MorphoPPOLearner(PPOTorchLearner):
    @override(PPOTorchLearner)
    def _create_iterator_if_necessary(self, *, num_epochs: int = 1, **kwargs: Any) -> list[Any]:
        kwargs.update(minibatch_size=None, num_total_minibatches=0, shuffle_batch_per_epoch=False)
        (whole_batch,) = list(super()._create_iterator_if_necessary(num_epochs=1, **kwargs))
        return [whole_batch] * num_epochs

    @override(PPOTorchLearner)
    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: dict[str, Any], fwd_out: dict[str, Any]) -> torch.Tensor:
        loss = super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        with torch.no_grad():
            mask = batch[Columns.LOSS_MASK]  # present: the module is stateful, so sequences are padded
            dist = self.module[module_id].unwrapped().get_train_action_dist_cls().from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
            assert isinstance(dist, CausalFactoredDistribution)

            def masked_mean(x: torch.Tensor) -> torch.Tensor:
                return x[mask].mean()

            log_ratio = dist.logp(batch[Columns.ACTIONS]) - batch[Columns.ACTION_LOGP]
            # Schulman's unbiased estimator of KL(old || new): E[(r - 1) - log r], http://joschu.net/blog/kl-approx.html
            metrics = {APPROX_KL_KEY: masked_mean(torch.exp(log_ratio) - 1 - log_ratio)}
            for name, value in dist.head_entropies().items():
                metrics[ENTROPY_PREFIX + name] = masked_mean(value)
            self.metrics.log_dict(metrics, key=module_id, window=1)
        return loss
