"""The controller network: features + blueprint embeddings -> MLP -> LSTM -> one head per action part, and V(s).

Illegal values are masked in the logits (the mask travels in the observation), and the action distribution
ignores the heads that the chosen op does not read (see `distribution.py`). Observations arrive already
normalised by the env-to-module connector; the module does no normalisation of its own.

The spaces are sized for MAX_SLOTS slot positions on every host; an absent position has zero features, its
blueprint embedding is zeroed (by its present flag, which the filter leaves as it is) and its joint entries are
masked, so on a host of S slots the padding adds only zero inputs and masked logits.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.utils.annotations import override
from torch import nn

from esper_ray.contracts.actions import BLUEPRINT_NONE_INDEX, MAX_SLOTS, Op, encode_joint
from esper_ray.env.masks import action_nvec
from esper_ray.env.observation import SLOT_PRESENT, feature_size, slot_offset
from esper_ray.policy.distribution import CausalFactoredDistribution, relevance_matrix
from esper_ray.policy.layout import LAYOUT_KEY, check_layout

# A masked logit: finite (so 0 * logit stays 0 in entropies) and far below any real logit.
MASKED_LOGIT = -1e9

# Network sizes. "cpu" is small enough for the CPU quick start; "gpu" follows the original (DOMAIN.md s7).
MODEL_PRESETS: dict[str, dict[str, int]] = {
    "cpu": {"hidden_size": 64, "lstm_cell_size": 64, "head_hidden": 32, "blueprint_embedding": 4},
    "gpu": {"hidden_size": 512, "lstm_cell_size": 512, "head_hidden": 256, "blueprint_embedding": 4},
}


def _mlp_head(inputs: int, hidden: int, outputs: int, gain: float) -> nn.Sequential:
    head = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, outputs))
    nn.init.orthogonal_(head[0].weight, gain=2**0.5)
    nn.init.orthogonal_(head[2].weight, gain=gain)  # small gain: near-uniform policy, near-zero values at start
    nn.init.zeros_(head[0].bias)
    nn.init.zeros_(head[2].bias)
    return head


def run_lstm(
    lstm: nn.LSTM, x: torch.Tensor, state: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy's LSTM over x [B, T, F] from state {"h", "c"} [B, cell]: outputs [B, T, cell] and the state after.
    One step on the CPU (sampling in an env runner) takes the plain LSTM cell: nn.LSTM on the CPU goes through
    oneDNN, which re-packs the weights on every call: 5.0-5.8 ms against 0.21-0.23 ms a step for the 512-unit `gpu`
    preset on one core (0.08 against 0.02 ms for `cpu`; benchmarks/probes/lstm_step.py); same weights, same math."""
    if x.shape[1] == 1 and x.device.type == "cpu":
        h, c = torch.lstm_cell(
            x[:, 0], (state["h"], state["c"]), lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0
        )
        return h.unsqueeze(1), {"h": h, "c": c}
    out, (h, c) = lstm(x, (state["h"].unsqueeze(0), state["c"].unsqueeze(0)))
    return out, {"h": h.squeeze(0), "c": c.squeeze(0)}


class LeanActing:
    """The forward passes of a policy module whose `_outputs(batch)` gives the action inputs, the recurrent state and
    the embeddings V(s) reads. No layer of these modules acts differently in training and in evaluation (no dropout,
    no batch norm: tests/test_policy.py), so acting skips RLlib's eval() and train() around every call, which walk
    all the submodules twice a step: about 0.3 ms of RLlib's 3 ms loop a step (benchmarks/probes/
    env_runner_overhead.py --model gpu --replay-env)."""

    def _outputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    @override(TorchRLModule)
    def forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._forward_exploration(batch, **kwargs)  # type: ignore[attr-defined]

    @override(TorchRLModule)
    def forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._forward_inference(batch, **kwargs)  # type: ignore[attr-defined]

    @override(TorchRLModule)
    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        outputs = self._outputs(batch)
        del outputs[Columns.EMBEDDINGS]  # sampling stores every output in the episode: keep it lean
        return outputs

    @override(TorchRLModule)
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._outputs(batch)  # the loss reuses the embeddings for V(s)


class MorphoPolicyModule(LeanActing, TorchRLModule, ValueFunctionAPI):
    """model_config keys: hidden_size, lstm_cell_size, head_hidden, blueprint_embedding (see MODEL_PRESETS),
    prune_logit and fossilize_logit (optional): the initial bias of the op head's PRUNE and FOSSILIZE entries, and
    policy_layout (policy/layout.py; optional here, checked when given): what the inputs and outputs mean."""

    @override(TorchRLModule)
    def setup(self) -> None:
        cfg = self.model_config
        if cfg.get(LAYOUT_KEY) is not None:
            check_layout(cfg[LAYOUT_KEY], "policy", "flat")
        spaces = self.observation_space.spaces  # type: ignore[union-attr]
        self.num_slots = int(spaces["blueprint_ids"].shape[0])
        features = int(spaces["features"].shape[0])
        self.nvec = [int(n) for n in self.action_space.nvec]  # type: ignore[union-attr]
        if (self.num_slots, features, self.nvec) != (MAX_SLOTS, feature_size(), action_nvec()):
            raise ValueError(
                f"policy: spaces of {self.num_slots} slots, {features} features and action heads {self.nvec}; "
                f"this code's are {MAX_SLOTS}, {feature_size()} and {action_nvec()} (MAX_SLOTS={MAX_SLOTS})"
            )
        self.present_columns = [slot_offset(i) + SLOT_PRESENT for i in range(MAX_SLOTS)]
        self.cell = int(cfg["lstm_cell_size"])
        self.embedding = nn.Embedding(BLUEPRINT_NONE_INDEX + 1, int(cfg["blueprint_embedding"]))
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.encoder = nn.Sequential(
            nn.Linear(features + self.num_slots * int(cfg["blueprint_embedding"]), int(cfg["hidden_size"])),
            nn.LayerNorm(int(cfg["hidden_size"])),
            nn.ReLU(),
        )
        self.lstm = nn.LSTM(int(cfg["hidden_size"]), self.cell, batch_first=True)
        self.policy_heads = nn.ModuleList([_mlp_head(self.cell, int(cfg["head_hidden"]), n, 0.01) for n in self.nvec])
        with torch.no_grad():  # priors, learnable like any bias: how often an untrained policy prunes and commits
            for op, key in ((Op.PRUNE, "prune_logit"), (Op.FOSSILIZE, "fossilize_logit")):
                entries = [encode_joint(op, i) for i in range(MAX_SLOTS)]  # absent positions are masked anyway
                self.policy_heads[0][2].bias[entries] = float(cfg.get(key, 0.0))
        self.value_head = _mlp_head(self.cell, int(cfg["head_hidden"]), 1, 1.0)
        self.action_dist_cls = CausalFactoredDistribution.get_partial_dist_cls(
            input_lens=self.nvec, relevance=relevance_matrix()
        )

    @override(TorchRLModule)
    def get_initial_state(self) -> dict[str, np.ndarray]:
        return {"h": np.zeros(self.cell, np.float32), "c": np.zeros(self.cell, np.float32)}

    def _embed(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        obs = batch[Columns.OBS]
        features = obs["features"].float()  # [B, T, F]
        present = features[..., self.present_columns].unsqueeze(-1)  # [B, T, S, 1]: absent positions add nothing
        blueprints = (self.embedding(obs["blueprint_ids"].long()) * present).flatten(-2)  # [B, T, S * E]
        x = self.encoder(torch.cat([features, blueprints], dim=-1))
        return run_lstm(self.lstm, x, batch[Columns.STATE_IN])

    def _logits(self, embeddings: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = torch.cat([head(embeddings) for head in self.policy_heads], dim=-1)
        return logits.masked_fill(mask == 0, MASKED_LOGIT)

    def _outputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        embeddings, state_out = self._embed(batch)
        return {
            Columns.ACTION_DIST_INPUTS: self._logits(embeddings, batch[Columns.OBS]["action_mask"]),
            Columns.STATE_OUT: state_out,
            Columns.EMBEDDINGS: embeddings,
        }

    @override(ValueFunctionAPI)
    def compute_values(self, batch: dict[str, Any], embeddings: torch.Tensor | None = None) -> torch.Tensor:
        """V(s): [B, T] (the last dimension squeezed)."""
        if embeddings is None:
            embeddings, _ = self._embed(batch)
        return self.value_head(embeddings).squeeze(-1)
