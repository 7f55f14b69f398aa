"""A slot-equivariant controller network (issue 75): one set of weights for every slot, however many the space holds.

MorphoPolicyModule reads the flat features of MAX_SLOTS positions through one Linear, so each position has weights of
its own (a position no training host fills is never trained), and its argument heads do not see the chosen slot
(P(blueprint | slot) = P(blueprint)). Here:

- one encoder maps every slot's block (its measured features, descriptors and blueprint embedding) to a token, and one
  more the run features to a run token;
- one attention layer mixes the tokens (no positional encoding: a slot is known by its descriptors, not its place in
  the list); absent slots are masked as keys, and the run token, always present, keeps a host with no slot present
  from attending to nothing. Architecture `slots-mean` mixes them instead as Deep Sets do: every token gets one
  Linear of the masked mean of the present tokens (the run's included), the same for all; the rest is the same;
- an LSTM over time reads the run token beside the masked mean of the slot tokens (the recurrent state "h", "c");
- per slot, from its token and the LSTM output, one shared layer gives the logits of the 5 slotted ops and one the
  argument logits of every argument head but the blueprint; WAIT and V(s) come from the LSTM output;
- the blueprint logits of slot s score each vocabulary entry b the host offers: one shared small MLP of [s's token,
  the LSTM output, b's embedding, what b would add at s (the observation's `blueprint_costs`: parameters and FLOPs
  relative to the host, env/blueprint_costs.py)] gives one logit. A built-in blueprint has its own embedding row; every
  plug-in name shares one "plug-in" row (PLUGIN_ROW), so a name no run has trained on is scored from its costs and a
  row every plug-in trains, never from an untrained row of its own. Only the entries some observation of the batch
  offers are scored (the others are masked anyway), so the cost of the head grows with what hosts offer, not with
  MAX_BLUEPRINTS.

ACTION_DIST_INPUTS: the joint head in contracts/actions.py's layout for S slots (0 = WAIT, then 1 + (op - 1) * S +
slot), then S rows of argument logits (slot_distribution.py samples the arguments from the chosen slot's row). Masked
like MorphoPolicyModule's: the joint entries by the mask's joint part, each row by its heads' masks. S is read from
the observation space, so the same weights run on spaces of any slot count (slot_spaces builds them).

Trained with `policy: slots` or `slots-mean` (TrainConfig.policy; the layout's architecture says which, and a
checkpoint of the other is refused); the default stays MorphoPolicyModule.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.utils.annotations import override
from torch import nn

from esper_ray.contracts.actions import (
    BLUEPRINT_NONE_INDEX,
    HEAD_SIZES_AFTER_JOINT,
    MAX_BLUEPRINTS,
    SLOTTED_OPS,
    Blueprint,
    Op,
)
from esper_ray.contracts.train_config import SLOT_ARCHITECTURES
from esper_ray.env.blueprint_costs import COST_FEATURES
from esper_ray.env.observation import BASE_FEATURES, FEATURE_BOUND, SLOT_BLOCK, SLOT_PRESENT
from esper_ray.policy.layout import LAYOUT_KEY, check_layout
from esper_ray.policy.rl_module import MASKED_LOGIT, LeanActing, _mlp_head, run_lstm
from esper_ray.policy.slot_distribution import (
    ARGUMENT_SIZE,
    SlotConditionedDistribution,
    slot_joint_size,
    slot_relevance_matrix,
)

# Network sizes: hidden_size is the width of a slot's token. "cpu" is small enough for the CPU quick start; "gpu" is a
# first guess, not yet measured.
SLOT_MODEL_PRESETS: dict[str, dict[str, int]] = {
    "cpu": {"hidden_size": 64, "lstm_cell_size": 64, "head_hidden": 32, "blueprint_embedding": 4, "attention_heads": 4},
    "gpu": {
        "hidden_size": 256,
        "lstm_cell_size": 512,
        "head_hidden": 256,
        "blueprint_embedding": 8,
        "attention_heads": 8,
    },
}


PLUGIN_ROW = len(Blueprint)
"""The embedding row every plug-in blueprint shares; the built-ins keep rows 0..12 (their vocabulary indices)."""
NONE_ROW = PLUGIN_ROW + 1
"""The embedding row of "no seed" (BLUEPRINT_NONE_INDEX)."""


def embedding_rows() -> torch.Tensor:
    """The embedding row of each blueprint id 0..BLUEPRINT_NONE_INDEX: a built-in's own, PLUGIN_ROW, NONE_ROW."""
    rows = torch.full((BLUEPRINT_NONE_INDEX + 1,), PLUGIN_ROW, dtype=torch.long)
    rows[:PLUGIN_ROW] = torch.arange(PLUGIN_ROW)
    rows[BLUEPRINT_NONE_INDEX] = NONE_ROW
    return rows


def slot_spaces(num_slots: int) -> tuple[gym.spaces.Dict, gym.spaces.MultiDiscrete]:
    """The observation and action spaces for `num_slots` slot positions, built as the env builds its own for
    MAX_SLOTS (env/morphogenetic_env.py): the same at MAX_SLOTS."""
    joint = slot_joint_size(num_slots)
    nvec = [joint, *HEAD_SIZES_AFTER_JOINT]
    observation = gym.spaces.Dict(
        {
            "features": gym.spaces.Box(-10.0, 10.0, shape=(BASE_FEATURES + SLOT_BLOCK * num_slots,), dtype=np.float32),
            "blueprint_ids": gym.spaces.MultiDiscrete([BLUEPRINT_NONE_INDEX + 1] * num_slots),
            "blueprint_costs": gym.spaces.Box(
                0.0, FEATURE_BOUND, shape=(num_slots, MAX_BLUEPRINTS, len(COST_FEATURES)), dtype=np.float32
            ),
            "action_mask": gym.spaces.MultiDiscrete(np.full(sum(nvec), 2), dtype=np.int8),
        }
    )
    return observation, gym.spaces.MultiDiscrete(nvec)


def _encoder(inputs: int, width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, width), nn.LayerNorm(width), nn.ReLU())


class SlotPolicyModule(LeanActing, TorchRLModule, ValueFunctionAPI):
    """model_config keys: hidden_size, lstm_cell_size, head_hidden, blueprint_embedding, attention_heads (see
    SLOT_MODEL_PRESETS), prune_logit and fossilize_logit (optional): the initial bias of the shared op layer's PRUNE
    and FOSSILIZE entries, and policy_layout (optional here, checked when given; its architecture, slots or
    slots-mean, picks the mixing; attention without one). Acts as LeanActing says: its attention's dropout is 0, so
    no layer acts differently in training."""

    @override(TorchRLModule)
    def setup(self) -> None:
        cfg = self.model_config
        layout = cfg.get(LAYOUT_KEY)
        self.architecture = str(layout.get("architecture")) if isinstance(layout, dict) else SLOT_ARCHITECTURES[0]
        if self.architecture not in SLOT_ARCHITECTURES:
            raise ValueError(f"policy: architecture {self.architecture!r}: this module is {list(SLOT_ARCHITECTURES)}")
        if layout is not None:
            check_layout(layout, "policy", self.architecture)
        spaces = self.observation_space.spaces  # type: ignore[union-attr]
        self.num_slots = int(spaces["blueprint_ids"].shape[0])
        expected_obs, expected_action = slot_spaces(self.num_slots)
        features = int(spaces["features"].shape[0])
        nvec = [int(n) for n in self.action_space.nvec]  # type: ignore[union-attr]
        if (features, nvec) != (expected_obs["features"].shape[0], [int(n) for n in expected_action.nvec]):
            raise ValueError(
                f"policy: spaces of {self.num_slots} slots with {features} features and action heads {nvec}; "
                f"{self.num_slots} slots need {expected_obs['features'].shape[0]} and {list(expected_action.nvec)}"
            )
        self.joint_size = nvec[0]
        width, self.cell, hidden = int(cfg["hidden_size"]), int(cfg["lstm_cell_size"]), int(cfg["head_hidden"])
        heads = int(cfg.get("attention_heads", 1))
        if heads < 1 or width % heads:
            raise ValueError(f"policy: attention_heads={heads}: must be >= 1 and divide hidden_size={width}")
        embedding = int(cfg["blueprint_embedding"])
        self.embedding = nn.Embedding(NONE_ROW + 1, embedding)
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.register_buffer("embedding_rows", embedding_rows(), persistent=False)
        self.slot_encoder = _encoder(SLOT_BLOCK + embedding, width)
        self.run_encoder = _encoder(BASE_FEATURES, width)
        if self.architecture == "slots":
            self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        else:  # slots-mean: Deep Sets' mixing, one Linear of the tokens' masked mean
            self.mean_mixing = nn.Linear(width, width)
        self.attention_norm = nn.LayerNorm(width)  # the mixing's norm (named when attention was the only one)
        self.feed_forward = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
        self.feed_forward_norm = nn.LayerNorm(width)
        self.summary = _encoder(2 * width, width)
        self.lstm = nn.LSTM(width, self.cell, batch_first=True)
        self.op_head = _mlp_head(width + self.cell, hidden, len(SLOTTED_OPS), 0.01)
        self.argument_head = _mlp_head(width + self.cell, hidden, ARGUMENT_SIZE - MAX_BLUEPRINTS, 0.01)
        # The blueprint scorer: an MLP of [token, LSTM output, embedding, costs] -> 1 whose first layer is split in
        # two, the slot's part once per slot and the blueprint's once per (slot, blueprint): their sum is that layer.
        self.blueprint_context = nn.Linear(width + self.cell, hidden)
        self.blueprint_input = nn.Linear(embedding + len(COST_FEATURES), hidden, bias=False)
        self.blueprint_score = nn.Linear(hidden, 1)
        nn.init.orthogonal_(self.blueprint_score.weight, gain=0.01)  # near-uniform at start, as the other heads
        nn.init.zeros_(self.blueprint_score.bias)
        self.wait_head = _mlp_head(self.cell, hidden, 1, 0.01)
        with torch.no_grad():  # priors, learnable like any bias: how often an untrained policy prunes and commits
            for op, key in ((Op.PRUNE, "prune_logit"), (Op.FOSSILIZE, "fossilize_logit")):
                self.op_head[2].bias[SLOTTED_OPS.index(op)] = float(cfg.get(key, 0.0))
        self.value_head = _mlp_head(self.cell, hidden, 1, 1.0)
        self.action_dist_cls = SlotConditionedDistribution.get_partial_dist_cls(
            num_slots=self.num_slots, relevance=slot_relevance_matrix(self.num_slots)
        )

    @override(TorchRLModule)
    def get_initial_state(self) -> dict[str, np.ndarray]:
        return {"h": np.zeros(self.cell, np.float32), "c": np.zeros(self.cell, np.float32)}

    def _tokens(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mixed run token [B, T, W], slot tokens [B, T, S, W] and present flags [B, T, S] (bool)."""
        features = obs["features"].float()
        blocks = features[..., BASE_FEATURES:].unflatten(-1, (self.num_slots, SLOT_BLOCK))  # [B, T, S, SLOT_BLOCK]
        present = blocks[..., SLOT_PRESENT] > 0.5
        blueprints = self.embedding(self.embedding_rows[obs["blueprint_ids"].long()])
        slots = self.slot_encoder(torch.cat([blocks, blueprints], dim=-1))
        run = self.run_encoder(features[..., :BASE_FEATURES])
        tokens = torch.cat([run.unsqueeze(-2), slots], dim=-2)  # [B, T, 1 + S, W]
        flat = tokens.flatten(0, 1)
        absent = torch.cat([torch.zeros_like(present[..., :1]), ~present], dim=-1).flatten(0, 1)  # run: never absent
        if self.architecture == "slots":
            mixed, _ = self.attention(flat, flat, flat, key_padding_mask=absent, need_weights=False)
        else:
            keep = (~absent).unsqueeze(-1).float()  # the run token is always kept: the sum below is >= 1
            mixed = self.mean_mixing((flat * keep).sum(-2, keepdim=True) / keep.sum(-2, keepdim=True))
        flat = self.attention_norm(flat + mixed)
        flat = self.feed_forward_norm(flat + self.feed_forward(flat))
        tokens = flat.unflatten(0, tokens.shape[:2])
        return tokens[..., 0, :], tokens[..., 1:, :], present

    def _embed(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """LSTM output [B, T, C], slot tokens [B, T, S, W] and the state out."""
        run, slots, present = self._tokens(batch[Columns.OBS])
        weights = present.unsqueeze(-1).float()
        pooled = (slots * weights).sum(-2) / weights.sum(-2).clamp(min=1.0)  # masked mean; 0 when none is present
        out, state = run_lstm(self.lstm, self.summary(torch.cat([run, pooled], dim=-1)), batch[Columns.STATE_IN])
        return out, slots, state

    def _blueprint_logits(self, per_slot: torch.Tensor, costs: torch.Tensor, offered: torch.Tensor) -> torch.Tensor:
        """[B, T, S, MAX_BLUEPRINTS]: the score of each blueprint some observation offers (`offered` [B, T, V], the
        blueprint head's mask), MASKED_LOGIT elsewhere; `costs` [B, T, S, V, len(COST_FEATURES)]."""
        columns = offered.flatten(0, -2).any(0).nonzero().squeeze(-1)  # [K]
        embedded = self.embedding(self.embedding_rows[columns])  # [K, E]
        chosen = costs.float().index_select(-2, columns)  # [B, T, S, K, 2]
        inputs = torch.cat([embedded.expand(*chosen.shape[:-1], embedded.shape[-1]), chosen], dim=-1)
        hidden = torch.relu(self.blueprint_context(per_slot).unsqueeze(-2) + self.blueprint_input(inputs))
        scores = self.blueprint_score(hidden).squeeze(-1)  # [B, T, S, K]
        logits = scores.new_full((*scores.shape[:-1], MAX_BLUEPRINTS), MASKED_LOGIT)
        return logits.index_copy(-1, columns, scores)

    def _logits(self, out: torch.Tensor, slots: torch.Tensor, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        mask = obs["action_mask"]
        per_slot = torch.cat([slots, out.unsqueeze(-2).expand(*slots.shape[:-1], out.shape[-1])], dim=-1)
        ops = self.op_head(per_slot).transpose(-1, -2).flatten(-2)  # [B, T, 5 * S], op-major like the joint layout
        joint = torch.cat([self.wait_head(out), ops], dim=-1)
        offered = mask[..., self.joint_size : self.joint_size + MAX_BLUEPRINTS] != 0
        blueprints = self._blueprint_logits(per_slot, obs["blueprint_costs"], offered)
        rows = torch.cat([blueprints, self.argument_head(per_slot)], dim=-1)  # [B, T, S, A], blueprint head first
        arguments_mask = mask[..., self.joint_size :].unsqueeze(-2)  # one mask for every slot's row
        joint = joint.masked_fill(mask[..., : self.joint_size] == 0, MASKED_LOGIT)
        rows = rows.masked_fill(arguments_mask == 0, MASKED_LOGIT)
        return torch.cat([joint, rows.flatten(-2)], dim=-1)

    def _outputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        out, slots, state_out = self._embed(batch)
        return {
            Columns.ACTION_DIST_INPUTS: self._logits(out, slots, batch[Columns.OBS]),
            Columns.STATE_OUT: state_out,
            Columns.EMBEDDINGS: out,
        }

    @override(ValueFunctionAPI)
    def compute_values(self, batch: dict[str, Any], embeddings: torch.Tensor | None = None) -> torch.Tensor:
        """V(s): [B, T] (the last dimension squeezed)."""
        if embeddings is None:
            embeddings, _, _ = self._embed(batch)
        return self.value_head(embeddings).squeeze(-1)
