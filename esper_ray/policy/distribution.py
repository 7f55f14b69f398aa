"""The action distribution of the factored action: a joint (op, slot) head, then one head per argument.

Heads that the chosen op does not read (blueprint when pruning, say) are ignored by the env, so they must
not enter the log-probability, the entropy or the KL either, or the policy would be credited and
penalised for noise. With R[j, h] = 1 when the op of joint index j reads head h:

    log p(a)  = log pi_J(j) + sum_h R[j, h] log pi_h(a_h)
    H         = H(pi_J) + sum_h P(h read) H(pi_h),        P(h read) = sum_j pi_J(j) R[j, h]
    KL(p||q)  = KL(pi_J||q_J) + sum_h P_p(h read) KL(pi_h||q_h)

which are the exact log-probability, entropy and KL of the distribution over what the env executes.

The entropy that PPO's bonus maximises detaches P(h read). Left attached, the exact entropy grows whenever the
policy picks ops that read more heads (GERMINATE reads 4, PRUNE 2, WAIT none), so the bonus paid the policy
for germinating and pruning whatever the return: on digits-impaired it drove P(PRUNE) of a young seed from
0.5 to 0.75 in 20 rounds while pruning cost reward. Detached, each argument head's entropy still counts only as
often as the op reads it, and the op/slot choice is pushed only by its own entropy H(pi_J) and the return.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core.distribution.distribution import Distribution
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical, TorchDeterministic
from ray.rllib.utils.annotations import override

from esper_ray.contracts.actions import HEAD_NAMES, RELEVANT_HEADS, decode_joint, joint_size


def relevance_matrix() -> list[list[bool]]:
    """R[j][h]: does the op of joint index j read argument head h (heads after the joint one)?"""
    rows = []
    for j in range(joint_size()):
        op, _ = decode_joint(j)
        rows.append([name in RELEVANT_HEADS[op] for name in HEAD_NAMES[1:]])
    return rows


class ArgumentEntropies:
    """What the learner reads of a factored distribution's entropy, from its `joint` head and its
    `weighted_argument_entropies` (each argument head's entropy weighted by how often it is read, as the distribution
    defines it): the entropy PPO's bonus maximises, each head's for the metrics, one argument head's for its bonus."""

    joint: TorchCategorical

    def weighted_argument_entropies(self, *, detach_read: bool = True) -> torch.Tensor:
        raise NotImplementedError

    def head_entropies(self) -> dict[str, torch.Tensor]:
        """Entropy of each head, argument heads weighted by the chance they are read."""
        weighted = self.weighted_argument_entropies(detach_read=False)
        return {
            HEAD_NAMES[0]: self.joint.entropy(),
            **{name: weighted[..., i] for i, name in enumerate(HEAD_NAMES[1:])},
        }

    def argument_entropy(self, name: str) -> torch.Tensor:
        """The weighted entropy of one argument head, P(read) held constant for the gradient as in entropy()."""
        i = HEAD_NAMES.index(name) - 1
        if i < 0:
            raise ValueError(f"{name!r} is the joint head; argument heads: {list(HEAD_NAMES[1:])}")
        return self.weighted_argument_entropies()[..., i]

    @override(Distribution)
    def entropy(self) -> torch.Tensor:
        """H(pi_J) + the weighted argument entropies, P(read) held constant for the gradient (see the module doc)."""
        return self.joint.entropy() + self.weighted_argument_entropies().sum(-1)


class CausalFactoredDistribution(ArgumentEntropies, Distribution):
    def __init__(self, heads: Sequence[TorchCategorical], relevance: torch.Tensor) -> None:
        super().__init__()
        self.heads = list(heads)
        self.relevance = relevance  # [J, H-1] float

    @property
    def joint(self) -> TorchCategorical:
        return self.heads[0]

    def read_probability(self) -> torch.Tensor:
        """[..., H-1] probability that each argument head is read by the sampled op."""
        return torch.softmax(self.joint.logits, dim=-1) @ self.relevance

    @override(Distribution)
    def sample(self, *, sample_shape: tuple[int, ...] = (), **kwargs: object) -> torch.Tensor:
        return torch.stack([h.sample() for h in self.heads], dim=-1)

    @override(Distribution)
    def rsample(self, *, sample_shape: tuple[int, ...] = (), **kwargs: object) -> torch.Tensor:
        raise NotImplementedError("categorical heads have no reparameterised sample")

    @override(Distribution)
    def logp(self, value: torch.Tensor, **kwargs: object) -> torch.Tensor:
        actions = value.long().unbind(dim=-1)
        read = self.relevance[actions[0]]  # [..., H-1]
        argument_logps = torch.stack([h.logp(a) for h, a in zip(self.heads[1:], actions[1:])], dim=-1)
        return self.joint.logp(actions[0]) + (read * argument_logps).sum(-1)

    def weighted_argument_entropies(self, *, detach_read: bool = True) -> torch.Tensor:
        """[..., H-1] P(h read) H(pi_h) of each argument head; with `detach_read` P(h read) is held constant for the
        gradient (see the module doc), so a bonus on these moves each head's own choice, never how often it is read."""
        read = self.read_probability()
        if detach_read:
            read = read.detach()
        return read * torch.stack([h.entropy() for h in self.heads[1:]], dim=-1)

    @override(Distribution)
    def kl(self, other: Distribution) -> torch.Tensor:
        assert isinstance(other, CausalFactoredDistribution), type(other)
        read = self.read_probability()
        argument_kls = torch.stack([h.kl(o) for h, o in zip(self.heads[1:], other.heads[1:])], dim=-1)
        return self.joint.kl(other.joint) + (read * argument_kls).sum(-1)

    @staticmethod
    @override(Distribution)
    def required_input_dim(space: gym.Space, **kwargs: object) -> int:
        assert isinstance(space, gym.spaces.MultiDiscrete), space
        return int(np.sum(space.nvec))

    @classmethod
    @override(Distribution)
    def from_logits(  # type: ignore[override]
        cls, logits: torch.Tensor, input_lens: Sequence[int], relevance: Sequence[Sequence[bool]], **kwargs: object
    ) -> CausalFactoredDistribution:
        if sum(input_lens) != logits.shape[-1]:
            raise ValueError(f"logits have {logits.shape[-1]} entries; the heads need {sum(input_lens)}")
        heads = [TorchCategorical(logits=part) for part in torch.split(logits, list(input_lens), dim=-1)]
        return cls(heads, torch.tensor(relevance, dtype=logits.dtype, device=logits.device))

    def to_deterministic(self) -> TorchDeterministic:
        """Greedy: the most likely value of every head (argument heads the op ignores do no harm)."""
        return TorchDeterministic(loc=torch.stack([h.logits.argmax(dim=-1) for h in self.heads], dim=-1))
