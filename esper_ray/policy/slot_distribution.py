"""The action distribution of the slot-equivariant policy (slot_module.py): the argument heads conditioned on the slot.

The logits are the joint (op, slot) head for S slots (1 + len(SLOTTED_OPS) * S entries, contracts/actions.py's
layout: 0 = WAIT, then op-major 1 + (op - 1) * S + slot), then one row of argument logits per slot (S x A, A the
argument heads' sizes together, in HEAD_NAMES order). A joint index j is sampled first; each argument head is then
sampled from the row of slot(j), the slot j acts on (WAIT reads no argument: its row, slot 0's, is never read). So
P(blueprint | slot) is the slot's own, where CausalFactoredDistribution has one blueprint head for every slot.

With R[j, h] = 1 when the op of j reads head h and pi_h(. | s) head h's distribution in slot s's row:

    log p(a)  = log pi_J(j) + sum_h R[j, h] log pi_h(a_h | slot(j))
    H         = H(pi_J) + sum_j pi_J(j) sum_h R[j, h] H(pi_h | slot(j))
    KL(p||q)  = KL(pi_J||q_J) + sum_j pi_J(j) sum_h R[j, h] KL(pi_h(. | slot(j)) || q_h(. | slot(j)))

the exact log-probability, entropy and KL of the distribution over what the env executes (unread heads marginalised).

The entropy that PPO's bonus maximises holds pi_J constant in its second term, as CausalFactoredDistribution holds
P(h read) (see its module doc): left attached, the bonus pays the policy for choosing ops, and here also slots, whose
argument rows are more uncertain or read more heads (GERMINATE reads 4, WAIT none), which drove P(PRUNE) up while
pruning cost reward. Detached, each slot's argument entropy counts as often as it is read, and the (op, slot) choice
is pushed only by H(pi_J) and the return. The KL keeps pi_J attached, as CausalFactoredDistribution's does.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core.distribution.distribution import Distribution
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical, TorchDeterministic
from ray.rllib.utils.annotations import override

from esper_ray.contracts.actions import HEAD_NAMES, HEAD_SIZES_AFTER_JOINT, RELEVANT_HEADS, SLOTTED_OPS, Op
from esper_ray.policy.distribution import ArgumentEntropies

ARGUMENT_SIZE = sum(HEAD_SIZES_AFTER_JOINT)
"""Argument logits of one slot's row."""


def slot_joint_size(num_slots: int) -> int:
    """Entries of the joint (op, slot) head for `num_slots` slots."""
    return 1 + len(SLOTTED_OPS) * num_slots


def slots_of_joint_head(joint: int) -> int:
    """The slot count S of a joint head of `joint` entries (ValueError if no S gives it)."""
    slots, rest = divmod(joint - 1, len(SLOTTED_OPS))
    if rest or slots < 1:
        raise ValueError(f"joint head of {joint} entries: must be 1 + {len(SLOTTED_OPS)} x slots, slots >= 1")
    return slots


def joint_slot(num_slots: int) -> list[int]:
    """slot(j) for every joint index j: the slot it acts on; 0 for WAIT (which reads no argument)."""
    return [0] + [(j - 1) % num_slots for j in range(1, slot_joint_size(num_slots))]


def slot_relevance_matrix(num_slots: int) -> list[list[bool]]:
    """R[j][h]: does the op of joint index j (of a head for `num_slots` slots) read argument head h?"""
    ops = [Op.WAIT] + [op for op in SLOTTED_OPS for _ in range(num_slots)]
    return [[name in RELEVANT_HEADS[op] for name in HEAD_NAMES[1:]] for op in ops]


def slot_logits_size(num_slots: int) -> int:
    """ACTION_DIST_INPUTS entries for `num_slots` slots: the joint head, then S argument rows."""
    return slot_joint_size(num_slots) + num_slots * ARGUMENT_SIZE


class SlotConditionedDistribution(ArgumentEntropies, Distribution):
    def __init__(self, joint: TorchCategorical, arguments: Sequence[torch.Tensor], relevance: torch.Tensor) -> None:
        """`arguments`: per argument head, logits [..., S, size]; `relevance`: R [J, H-1] float."""
        super().__init__()
        self.joint = joint
        self.arguments = [torch.log_softmax(a, dim=-1) for a in arguments]  # [..., S, n_h] log-probabilities
        self.relevance = relevance
        self.num_slots = int(arguments[0].shape[-2])
        self.slot_of = torch.tensor(joint_slot(self.num_slots), dtype=torch.long, device=relevance.device)

    def _rows(self, joint: torch.Tensor) -> list[torch.Tensor]:
        """Per argument head, the log-probabilities [..., n_h] of the row of slot(joint)."""
        slot = self.slot_of[joint]
        # Actions may broadcast over the logits' batch (one set of logits, many actions), as TorchCategorical's do.
        batch = torch.broadcast_shapes(slot.shape, self.arguments[0].shape[:-2])
        index = slot.expand(batch)[..., None, None]
        return [
            logp.expand(*batch, *logp.shape[-2:]).gather(-2, index.expand(*batch, 1, logp.shape[-1])).squeeze(-2)
            for logp in self.arguments
        ]

    def slot_entropies(self) -> torch.Tensor:
        """[..., S, H-1]: the entropy of each argument head in each slot's row."""
        return torch.stack([-(logp.exp() * logp).sum(-1) for logp in self.arguments], dim=-1)

    def read_probability(self) -> torch.Tensor:
        """[..., H-1] probability that each argument head is read by the sampled op."""
        return torch.softmax(self.joint.logits, dim=-1) @ self.relevance

    def _weighted(self, per_slot: torch.Tensor, *, detach_joint: bool) -> torch.Tensor:
        """sum_j pi_J(j) R[j, h] x[slot(j), h] of a per-slot, per-head x [..., S, H-1]: [..., H-1]."""
        probs = torch.softmax(self.joint.logits, dim=-1)
        if detach_joint:
            probs = probs.detach()
        by_joint = per_slot[..., self.slot_of, :] * self.relevance  # [..., J, H-1]
        return (probs[..., None] * by_joint).sum(-2)

    @override(Distribution)
    def sample(self, *, sample_shape: tuple[int, ...] = (), **kwargs: object) -> torch.Tensor:
        joint = self.joint.sample()
        arguments = [torch.distributions.Categorical(logits=row).sample() for row in self._rows(joint)]
        return torch.stack([joint, *arguments], dim=-1)

    @override(Distribution)
    def rsample(self, *, sample_shape: tuple[int, ...] = (), **kwargs: object) -> torch.Tensor:
        raise NotImplementedError("categorical heads have no reparameterised sample")

    @override(Distribution)
    def logp(self, value: torch.Tensor, **kwargs: object) -> torch.Tensor:
        actions = value.long().unbind(dim=-1)
        read = self.relevance[actions[0]]  # [..., H-1]
        rows = self._rows(actions[0])
        argument_logps = torch.stack(
            [row.gather(-1, a[..., None]).squeeze(-1) for row, a in zip(rows, actions[1:])], -1
        )
        return self.joint.logp(actions[0]) + (read * argument_logps).sum(-1)

    def weighted_argument_entropies(self, *, detach_read: bool = True) -> torch.Tensor:
        """[..., H-1] sum_j pi_J(j) R[j, h] H(pi_h | slot(j)) of each argument head; with `detach_read` pi_J is held
        constant for the gradient (see the module doc), so a bonus on these moves the argument rows only."""
        return self._weighted(self.slot_entropies(), detach_joint=detach_read)

    @override(Distribution)
    def kl(self, other: Distribution) -> torch.Tensor:
        assert isinstance(other, SlotConditionedDistribution), type(other)
        per_slot = torch.stack(
            [(p.exp() * (p - q)).sum(-1) for p, q in zip(self.arguments, other.arguments)], dim=-1
        )  # [..., S, H-1]
        return self.joint.kl(other.joint) + self._weighted(per_slot, detach_joint=False).sum(-1)

    @staticmethod
    @override(Distribution)
    def required_input_dim(space: gym.Space, **kwargs: object) -> int:
        assert isinstance(space, gym.spaces.MultiDiscrete), space
        return slot_logits_size(slots_of_joint_head(int(space.nvec[0])))

    @classmethod
    @override(Distribution)
    def from_logits(  # type: ignore[override]
        cls,
        logits: torch.Tensor,
        num_slots: int,
        relevance: Sequence[Sequence[bool]] | None = None,
        **kwargs: object,
    ) -> SlotConditionedDistribution:
        """`relevance`: R for `num_slots` slots, slot_relevance_matrix(num_slots) when None."""
        if logits.shape[-1] != slot_logits_size(num_slots):
            raise ValueError(
                f"logits have {logits.shape[-1]} entries; {num_slots} slots need {slot_logits_size(num_slots)}"
            )
        joint_size = slot_joint_size(num_slots)
        rows = logits[..., joint_size:].unflatten(-1, (num_slots, ARGUMENT_SIZE))
        arguments = torch.split(rows, list(HEAD_SIZES_AFTER_JOINT), dim=-1)
        matrix = slot_relevance_matrix(num_slots) if relevance is None else relevance
        return cls(
            TorchCategorical(logits=logits[..., :joint_size]),
            arguments,
            torch.tensor(np.asarray(matrix, dtype=bool), dtype=logits.dtype, device=logits.device),
        )

    def to_deterministic(self) -> TorchDeterministic:
        """Greedy: the most likely joint index, then the most likely value of each head in its slot's row."""
        joint = self.joint.logits.argmax(dim=-1)
        return TorchDeterministic(loc=torch.stack([joint, *[row.argmax(-1) for row in self._rows(joint)]], dim=-1))
