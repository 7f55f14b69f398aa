"""summary.md and accuracy.png of a saved grown network, both drawn from its architecture description alone.

The description is what architecture.json holds (train/commands/grow.py builds it), so the summary can never say
something the file does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from esper_ray.morpho.grown_artifact import plugins_needed  # noqa: E402

SUMMARY_FILE = "summary.md"
CURVE_FILE = "accuracy.png"
EPOCH_NOTE = (
    "Epoch t is the step whose decision came just before host epoch t trained (epoch 0: the host before training)."
)


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def architecture_rows(architecture: Mapping[str, Any]) -> list[str]:
    """The table: the host, then every enabled slot (kept seed or not), with parameters and seed events."""
    seeds = {s["slot"]: s for s in architecture["seeds"]}
    run = architecture["run"]
    rows = [
        "| slot | blueprint | stage at the end | in the network | blend | alpha | parameters | germinated (epoch) | "
        "fossilized (epoch) |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| host | {architecture['topology']} host `{run['host_preset']}` | | yes | | | "
        f"{architecture['params']['host']:,} | | |",
    ]
    for slot, info in architecture["slots"].items():
        seed = seeds.get(slot)
        blend, alpha, params = (seed["blend"], f"{seed['alpha']:.4g}", f"{seed['params']:,}") if seed else ("", "", "")
        germinated, fossilized = (
            info[k] if info[k] is not None else "" for k in ("germinated_epoch", "fossilized_epoch")
        )
        rows.append(
            f"| {slot} | {info['blueprint'] or '-'} | {info['stage']} | {'yes' if seed else 'no'} | "
            f"{blend} | {alpha} | "
            f"{params} | {germinated} | {fossilized} |"
        )
    return rows


def prepare_lines(architecture: Mapping[str, Any]) -> list[str]:
    """How to feed the network, by the kind of input its task has (architecture.json's `input`, grow.py): normalised
    images [B, C, H, W], token ids [B, T], or a plug-in's own features (float vectors [B, F] for a vector host)."""
    spec = architecture["input"]
    shape = ", ".join(str(n) for n in spec["shape"])
    if spec["kind"] == "images":
        return [
            f"mean = torch.tensor({spec['mean']})[None, :, None, None]",
            f"std = torch.tensor({spec['std']})[None, :, None, None]",
            f"x = (raw.float() / {spec['scale']} - mean) / std  # raw: [B, {shape}] images as the task stores them",
            "logits = net(x)  # [B, classes]",
        ]
    if spec["kind"] == "features":
        what = "float features" if architecture.get("topology") == "vector" else "inputs"
        return [
            f"x = raw.float() / {spec['scale']}  # raw: [B, {shape}] {what} as the task stores them",
            "logits = net(x)  # [B, classes]",
        ]
    if spec["kind"] == "tokens":
        vocab = spec.get("vocab", 256)  # absent in files written before it was recorded: the byte vocabulary
        return [
            f"logits = net(tokens)  # tokens: [B, T] int64 token ids (0..{vocab - 1}), T <= {spec['shape'][0]}; "
            f"logits [B, T, {vocab}] predict the next token"
        ]
    return [f"# {spec['prepare']}"]  # a kind this code does not know: the file's own words


def usage_lines(folder: Path, architecture: Mapping[str, Any]) -> list[str]:
    plugins = plugins_needed(architecture)  # load_grown imports none on the file's word
    return [
        "```python",
        "import torch",
        "import esper_ray",
        "",
        # the folder's name, never its absolute path: the folder is meant to be shared, and moves
        (
            f"net = esper_ray.load_grown({folder.name!r})  "
            "# this folder; a torch nn.Module on the CPU, in eval mode (esper-ray needed, Ray not)"
            if not plugins
            else f"net = esper_ray.load_grown({folder.name!r}, plugins={plugins!r})  "
            "# this folder, its parts from these plug-ins "
            "(code: pass only those you trust); a torch nn.Module on the CPU, in eval mode (esper-ray needed, Ray not)"
        ),
        *prepare_lines(architecture),
        "```",
    ]


def no_seed_note(architecture: Mapping[str, Any]) -> str | None:
    """What a network with no kept seed says of itself (None when one was kept): it is the host alone."""
    if architecture["seeds"]:
        return None
    return "no seed was kept (none was fossilized by the run's end): this is the host alone"


def _probation_line(run: Mapping[str, Any]) -> list[str]:
    """What the run's end dropped: seeds still on probation are not part of the kept (committed) network."""
    dropped = run.get("params_dropped_on_probation")  # absent in files written before the committed model
    if not dropped:
        return []
    return [
        f"Seeds still on probation when the run ended ({dropped:,} parameters) were dropped; with them in, the test "
        f"accuracy was {_pct(run['test_accuracy_with_probation'])}."
    ]


def summary_markdown(folder: Path, architecture: Mapping[str, Any]) -> str:
    run, params = architecture["run"], architecture["params"]
    test_loss = f"test loss {run['test_loss']:.4f}" if run["test_loss"] is not None else "test loss not finite"
    ended = ", ended early by a governor rollback" if run["ended_by_rollback"] else ""
    lines = [
        f"# Grown network: task `{run['task']}`, env seed {run['seed']}",
        "",
        f"**Held-out test accuracy {_pct(run['test_accuracy'])}** ({test_loss}), "
        f"measured by the run on {run['device']} "
        f"(amp {run['amp']}) after {run['epochs']} of {run['max_epochs']} epochs{ended}. Validation accuracy "
        f"{_pct(run['initial_val_accuracy'])} before training, {_pct(run['final_val_accuracy'])} at the end.",
        f"Grown by: {run['controller']}. "
        f"Parameters: {params['host']:,} host + {params['seeds']:,} seeds = {params['total']:,}.",
        *([f"**{note[0].upper()}{note[1:]}.**"] if (note := no_seed_note(architecture)) else []),
        *_probation_line(run),
        "",
        "## Architecture",
        "",
        *architecture_rows(architecture),
        "",
        EPOCH_NOTE,
        f"The network holds {architecture['contents']}.",
        "",
        "## Accuracy",
        "",
        f"![validation and training accuracy by epoch, with the seeds' events]({CURVE_FILE})",
        "",
        "## Use it",
        "",
        *usage_lines(folder, architecture),
        "",
        "Reloaded on the CPU, the network computes what the run's final model computed, so it scores the test accuracy "
        "above exactly when the run was on the CPU without amp (after a GPU or amp run, within rounding). Files: "
        "`weights.pt` (a state_dict: `torch.load(path, weights_only=True)`), `architecture.json` (host config, seeds, "
        "parameters, input preparation, the run's settings and curves).",
    ]
    return "\n".join(lines) + "\n"


def plot_accuracy(path: Path, architecture: Mapping[str, Any]) -> None:
    """Validation accuracy by epoch (0 = before training), training accuracy, the final test accuracy, and a vertical
    line where each slot's seed was germinated (dotted) and fossilized (solid)."""
    run = architecture["run"]
    val, train = run["val_accuracy_by_epoch"], run["train_accuracy_by_epoch"]
    fig, ax = plt.subplots(figsize=(9.0, 4.2))
    ax.plot(range(len(val)), val, color="tab:blue", linewidth=2, marker="o", markersize=3, label="validation")
    train_points = [(e, a) for e, a in enumerate(train) if a is not None]
    if train_points:
        ax.plot(*zip(*train_points), color="tab:orange", linewidth=1.2, alpha=0.8, label="training (epoch mean)")
    last = len(val) - 1
    ax.scatter(
        [last],
        [run["test_accuracy"]],
        marker="*",
        s=160,
        color="tab:red",
        zorder=4,
        label=f"held-out test {_pct(run['test_accuracy'])}",
    )
    palette = plt.get_cmap("tab10")
    for i, (slot, info) in enumerate(architecture["slots"].items()):
        color = palette((i + 4) % 10)  # past the curves' colours
        for key, style, word in (("germinated_epoch", ":", "germinated"), ("fossilized_epoch", "-", "fossilized")):
            if info[key] is not None:
                ax.axvline(
                    info[key], color=color, linestyle=style, linewidth=1.2, label=f"{slot} {info['blueprint']} {word}"
                )
    ax.set_xlabel("epoch")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"host run of task {run['task']} (env seed {run['seed']}): {run['controller']}")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: never over the curves
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
