"""The grown network as the product: GrownNetwork, its folder (`--save DIR`) and `esper_ray.load_grown`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import esper_ray
from esper_ray.cli import main
from esper_ray.contracts.actions import Style
from esper_ray.contracts.lifecycle import LifecycleConfig
from esper_ray.contracts.stages import Stage
from esper_ray.contracts.transformer_host import TransformerHostConfig
from esper_ray.data.task_loading import load_task_data
from esper_ray.env import MorphogeneticEnv
from esper_ray.morpho.grown import grown_from
from esper_ray.morpho.grown_artifact import ARCHITECTURE_FILE, WEIGHTS_FILE, load_grown, save_grown_network
from esper_ray.morpho.model import MorphogeneticModel
from esper_ray.morpho.transformer import TransformerHost
from esper_ray.policy.baselines import wait_action
from esper_ray.train.commands.episodes import EpisodeHistory, run_episodes
from esper_ray.train.commands.grow import saver
from tests.morpho_helpers import drive_to, make_model, perturbed_for_eval

REPO = Path(__file__).resolve().parents[1]


def grow_every_kind_of_slot(model: MorphogeneticModel, blueprints: tuple[str, str, str]) -> None:
    """Slot 0 fossilized (gated blend), slot 1 blending in at alpha 1/3 (multiply), slot 2 still TRAINING (add)."""
    s0, s1, s2 = model.seed_slots()[:3]
    drive_to(s0, Stage.FOSSILIZED, blueprint=blueprints[0], style=Style.GATED_GATE)
    drive_to(s1, Stage.BLENDING, blueprint=blueprints[1], style=Style.LINEAR_MULTIPLY)
    s1.step_epoch()  # one tick of its 3-tick ramp: alpha 1/3
    drive_to(s2, Stage.TRAINING, blueprint=blueprints[2], style=Style.SIGMOID_ADD)


def cnn_model() -> tuple[MorphogeneticModel, torch.Tensor]:
    model = make_model(["r0c0", "r0c1", "r0c2", "r1c0"], auto_forward=False)
    grow_every_kind_of_slot(model, ("conv_light", "bottleneck", "attention"))
    return perturbed_for_eval(model), torch.randn(6, 1, 8, 8)


def transformer_model() -> tuple[MorphogeneticModel, torch.Tensor]:
    torch.manual_seed(0)
    host = TransformerHost(TransformerHostConfig(seq_len=16, d_model=32, n_heads=4, n_layers=3))
    model = MorphogeneticModel(host, ["r0c0", "r0c1", "r0c2"], LifecycleConfig(auto_forward=False))
    grow_every_kind_of_slot(model, ("mlp", "lora", "attention"))
    return perturbed_for_eval(model), torch.randint(0, 256, (4, 16))


@pytest.mark.parametrize("build", [cnn_model, transformer_model], ids=["cnn", "transformer"])
def test_saved_network_computes_the_committed_models_forward_bit_for_bit(build, tmp_path):
    """What a run keeps is its committed model, the host and its fossils (docs/design.md, "The end of a host run")."""
    model, x = build()
    assert [s.stage for s in model.seed_slots()[:3]] == [Stage.FOSSILIZED, Stage.BLENDING, Stage.TRAINING]
    with torch.no_grad():
        reference = model.fused_forward(x, model.committed_alphas()[None])[0]  # how the env measures test accuracy
        network = grown_from(model)
        assert torch.equal(network(x), reference)
        save_grown_network(tmp_path / "net", network, {})
        loaded = load_grown(tmp_path / "net")
        assert not loaded.training
        assert torch.equal(loaded(x), reference)
    kept = {s.slot: (s.stage, s.blend.name, s.alpha) for s in loaded.seed_specs}
    assert kept == {
        "r0c0": (Stage.FOSSILIZED, "GATE", 1.0)
    }  # the blending and the training seed are on probation: dropped
    architecture = json.loads((tmp_path / "net" / ARCHITECTURE_FILE).read_text())
    host_params = sum(p.numel() for p in model.host.parameters())
    seed_params = sum(p.numel() for p in model.slot("r0c0").seed_parameters())
    assert architecture["params"] == {"host": host_params, "seeds": seed_params, "total": host_params + seed_params}


class ScenarioController:
    """Constructs the end state under test: on its first decision it grows the env's slots (fossilized, blending,
    training), then waits. The env's own epochs then train the seeds and move the blend on."""

    def __init__(self, env: MorphogeneticEnv) -> None:
        self.env = env

    def reset(self) -> None:
        self.first = True

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        if self.first:
            grow_every_kind_of_slot(self.env.model, ("conv_light", "depthwise", "norm"))
            self.first = False
        return wait_action()


def test_the_metric_the_saved_network_and_the_reward_agree_on_what_the_run_kept(tmp_path):
    """The end of a host run keeps the committed model: the test metric, the saved network and the reward's last
    step all read host + fossils, and the seeds still on probation (one blending, one training) are left out."""
    env = MorphogeneticEnv(
        {
            "task": "digits-impaired",
            "max_epochs": 2,
            "device": "cpu",
            "auto_forward": False,
            "reward_mode": "committed",
            "param_cost_pp": 0.0,
            "committed_stage_weight": 0.0,
        }
    )
    folder = tmp_path / "grown"
    [summary] = run_episodes(
        env,
        ScenarioController(env),
        1,
        progress=False,
        measure_test=True,
        on_episode_end=saver(folder, "a scripted scenario"),
    )
    model = env.model
    assert summary.params_added == model.slot("r0c0").seed_params  # kept: the fossil only
    assert summary.params_on_probation == model.slot("r0c1").seed_params + model.slot("r0c2").seed_params
    assert summary.test_accuracy_with_probation is not None  # measured beside it, in the same fused pass
    assert sorted(p.name for p in folder.iterdir()) == ["accuracy.png", "architecture.json", "summary.md", "weights.pt"]
    network = load_grown(folder)
    data = load_task_data("digits-impaired")
    correct = 0
    with torch.no_grad():  # an independent count: plain forward, argmax, compare, in the env's validation chunks
        chunk = env.cfg.effective_val_batch_size
        for start in range(0, len(data.test_y), chunk):
            x, y = data.test_x[start : start + chunk], data.test_y[start : start + chunk]
            correct += int((network(data.prepare(x)).argmax(dim=1) == y).sum())
    assert correct / len(data.test_y) == summary.test_accuracy
    architecture = json.loads((folder / ARCHITECTURE_FILE).read_text())
    assert architecture["run"]["test_accuracy"] == summary.test_accuracy
    assert {s["slot"]: (s["stage"], s["alpha"]) for s in architecture["seeds"]} == {"r0c0": ("FOSSILIZED", 1.0)}
    assert architecture["slots"]["r0c1"]["in_network"] is False and architecture["slots"]["r0c2"] == {
        "stage": "TRAINING",
        "blueprint": "norm",
        "in_network": False,
        "germinated_epoch": 1,
        "fossilized_epoch": None,
    }
    summary_md = (folder / "summary.md").read_text()
    assert f"{100 * summary.test_accuracy:.2f} %" in summary_md and "| r0c1 | depthwise | BLENDING | no |" in summary_md
    assert "were dropped" in summary_md
    # the reward: the last step pays the committed model's validation accuracy, taking back what the seeds on
    # probation added (param cost and stage shaping off, so the potential is accuracy alone)
    env.reset(seed=0)
    controller = ScenarioController(env)
    controller.reset()
    obs, done = env._observation(), False
    while not done:
        obs, _, done, _, info = env.step(controller.act(obs))
    assert info["committed_seed_params"] == summary.params_added and info["seed_params"] > info["committed_seed_params"]
    assert info["reward/end_of_run"] == pytest.approx(
        env.reward_config.gamma * 100 * (info["committed_accuracy"] - info["val_accuracy"])
    )


def test_loading_needs_no_ray(tmp_path):
    model, _ = cnn_model()
    save_grown_network(tmp_path / "net", grown_from(model), {})
    code = (
        f"import sys, esper_ray; net = esper_ray.load_grown({str(tmp_path / 'net')!r}); "
        "assert 'ray' not in sys.modules, 'ray was imported'; print(type(net).__name__, net.training)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["GrownNetwork", "False"]


def test_partial_or_damaged_folders_name_the_file(tmp_path):
    model, _ = cnn_model()
    save_grown_network(tmp_path / "net", grown_from(model), {})
    with pytest.raises(FileNotFoundError, match="no such folder"):
        esper_ray.load_grown(tmp_path / "nowhere")
    for missing in (WEIGHTS_FILE, ARCHITECTURE_FILE):
        partial = tmp_path / f"without-{missing}"
        partial.mkdir()
        kept = ARCHITECTURE_FILE if missing == WEIGHTS_FILE else WEIGHTS_FILE
        (partial / kept).write_bytes((tmp_path / "net" / kept).read_bytes())
        with pytest.raises(FileNotFoundError, match=f"{missing} is missing"):
            load_grown(partial)
    weights = tmp_path / "net" / WEIGHTS_FILE
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=f"{WEIGHTS_FILE}: unreadable"):
        load_grown(tmp_path / "net")
    weights.write_bytes(whole)
    architecture = tmp_path / "net" / ARCHITECTURE_FILE
    described = json.loads(architecture.read_text())
    described["seeds"] = []  # the weights hold a seed the file no longer describes
    architecture.write_text(json.dumps(described))
    with pytest.raises(ValueError, match="does not fit.*Unexpected key.*seeds.r0c0"):
        load_grown(tmp_path / "net")
    architecture.write_text("{\"format\": ")
    with pytest.raises(ValueError, match=f"{ARCHITECTURE_FILE}: not valid JSON"):
        load_grown(tmp_path / "net")


def test_history_dates_each_slots_current_seed():
    history = EpisodeHistory()
    stages = [  # (r0c0, r0c1) after reset and after each step
        ("DORMANT", "DORMANT"),
        ("TRAINING", "DORMANT"),
        ("TRAINING", "TRAINING"),
        ("BLENDING", "PRUNED"),
        ("HOLDING", "EMBARGOED"),
        ("FOSSILIZED", "RESETTING"),
        ("FOSSILIZED", "DORMANT"),
        ("FOSSILIZED", "TRAINING"),
    ]
    for epoch, (a, b) in enumerate(stages):
        history.record(
            {
                "epoch": epoch,
                "episode_seed": 7,
                "val_accuracy": epoch / 10,
                "stages": {"r0c0": a, "r0c1": b},
                **({"train_accuracy": epoch / 20} if epoch else {}),
            }
        )
    assert history.seeds["r0c0"].germinated_epoch == 1 and history.seeds["r0c0"].fossilized_epoch == 5
    assert (
        history.seeds["r0c1"].germinated_epoch == 7 and history.seeds["r0c1"].fossilized_epoch is None
    )  # the second seed
    assert history.val_accuracy == [e / 10 for e in range(8)] and history.train_accuracy[0] is None


def test_save_refuses_a_used_folder_or_several_episodes_before_training(tmp_path, capsys):
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        main(["heuristic", "--task", "digits", "--save", str(used)])
    assert exit_info.value.code == 2 and "not an empty folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["heuristic", "--task", "digits", "--episodes", "2", "--save", str(tmp_path / "new")])
    assert exit_info.value.code == 2 and "--episodes 1" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_heuristic_save_writes_a_loadable_network(tmp_path, capsys):
    folder = tmp_path / "grown"
    assert (
        main(["heuristic", "--task", "digits", "--max-epochs", "2", "--device", "cpu", "--save", str(folder), "--json"])
        == 0
    )
    captured = capsys.readouterr()
    [row] = json.loads(captured.out)
    assert f"grown network: {folder}" in captured.err
    assert json.loads((folder / ARCHITECTURE_FILE).read_text())["run"]["test_accuracy"] == row["test_accuracy"]
    assert load_grown(folder)(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    for shared in folder.iterdir():  # files meant for sharing carry no path of this machine
        if shared.suffix in (".md", ".json"):
            assert str(tmp_path) not in shared.read_text(), shared.name
    assert "esper_ray.load_grown('grown')" in (folder / "summary.md").read_text()


@pytest.mark.parametrize("cwd", ["tmp", "runs", "/"])
def test_an_eval_save_names_its_checkpoint_by_its_run_wherever_the_command_ran(tmp_path, monkeypatch, cwd):
    """From / a name relative to the current folder is the whole path, a user's name from /home included
    (issue 69, item 10): the run folder's name and the path inside it, from anywhere."""
    from esper_ray.cli import shared_name

    checkpoint = tmp_path / "runs" / "digits" / "checkpoints" / "round_00020"
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir({"tmp": tmp_path, "runs": tmp_path / "runs", "/": Path("/")}[cwd])
    assert shared_name(checkpoint) == "digits/checkpoints/round_00020"


def test_a_flex_attention_seed_loads_where_it_cannot_train():
    """Grown on a GPU, loaded on a CPU: FlexAttention has no CPU backward, but the loaded network only runs forward."""
    from esper_ray.contracts.actions import BlendAlgorithm, Blueprint
    from esper_ray.contracts.host import Topology
    from esper_ray.morpho.grown import GrownSeedSpec, empty_grown_network
    from esper_ray.morpho.transformer_blueprints import FlexAttentionSeed

    spec = GrownSeedSpec("r0c1", Blueprint.FLEX_ATTENTION, BlendAlgorithm.ADD, 1.0, Stage.FOSSILIZED)
    config = {"seq_len": 16, "d_model": 32, "n_heads": 4, "n_layers": 2}
    network = empty_grown_network(Topology.TRANSFORMER, config, [spec]).eval()
    assert isinstance(network.seeds["r0c1"].seed, FlexAttentionSeed)
    with torch.no_grad():
        assert network(torch.randint(0, 256, (2, 16))).shape == (2, 16, 256)


def test_an_architecture_file_that_describes_another_network_is_refused(tmp_path):
    model, _ = cnn_model()
    save_grown_network(tmp_path / "net", grown_from(model), {})
    architecture = tmp_path / "net" / ARCHITECTURE_FILE
    described = json.loads(architecture.read_text())
    for field, value, match in (
        ("host_config", {**described["host_config"], "heads": 2}, "describes no network.*heads"),
        ("seeds", [{**described["seeds"][0], "stage": "TRAINING"}], "stage=.TRAINING.*expected one of"),
        ("seeds", [{**described["seeds"][0], "blueprint": "mlp"}], "not available for CNN hosts"),
    ):
        architecture.write_text(json.dumps({**described, field: value}))
        with pytest.raises(ValueError, match=match):
            load_grown(tmp_path / "net")


class RunsCode:
    """A crafted pickle: loading it without weights_only would create the file `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _damaged(tmp_path: Path, case: str) -> Path:
    """A saved network, then damaged as `case` says."""
    model, _ = cnn_model()
    folder = tmp_path / "net"
    save_grown_network(folder, grown_from(model), {})
    architecture, weights = folder / ARCHITECTURE_FILE, folder / WEIGHTS_FILE
    described = json.loads(architecture.read_text())

    def rewrite(**fields) -> None:
        architecture.write_text(json.dumps({**described, **fields}))

    if case == "empty weights":
        weights.write_bytes(b"")
    elif case == "crafted pickle":  # the real tensors plus an object: sizes check out, weights_only refuses it
        torch.save({**torch.load(weights, weights_only=True), "extra": RunsCode(tmp_path / "ran")}, weights)
    elif case == "compressed weights":  # a 2 KB zip may unpack to gigabytes: torch.save never compresses
        import zipfile

        with zipfile.ZipFile(weights, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("net/data/0", b"\0" * 10_000_000)
    elif case == "80 GB asked":  # a few bytes of JSON describing a huge host: refused before anything is allocated
        rewrite(host_config={**described["host_config"], "base_channels": 65536, "blocks": 4, "pool_layers": 3})
    elif case == "deep nesting":
        architecture.write_text("[" * 100_000 + "]" * 100_000)
    elif case == "oversized file":
        architecture.write_text(" " * (17 * 2**20))
    else:  # a field of the wrong type
        field, value = case.split("=", 1)
        if field.startswith("seeds[0]."):
            rewrite(seeds=[{**described["seeds"][0], field.split(".")[1]: json.loads(value)}])
        elif field.startswith("host_config."):
            rewrite(host_config={**described["host_config"], field.split(".")[1]: json.loads(value)})
        else:
            rewrite(**{field: json.loads(value)})
    return folder


@pytest.mark.parametrize(
    "case, expected",
    [
        ("empty weights", "weights.pt: empty (0 bytes)"),
        ("crafted pickle", "weights.pt: refused, it holds more than tensors"),
        ("compressed weights", "is compressed"),
        ("80 GB asked", "describes"),
        ("deep nesting", "not valid JSON (RecursionError"),
        ("oversized file", "more than an architecture file holds"),
        ("topology=3", "topology=3"),
        ('seeds="r0c1"', "seeds='r0c1'; expected a list"),
        ("seeds=[1]", "seeds[0]=1; expected a mapping"),
        ("host_config=[8]", "host_config=[8]; expected a mapping"),
        ('host_config.base_channels="8"', "host_config.base_channels='8'; expected an integer"),
        ("host_config.blocks=100000", "host_config.blocks=100000; expected an integer in [0, 64]"),
        ("params=3", "params=3; expected a mapping"),
        ('seeds[0].alpha="x"', "alpha='x'; expected a number"),
        ("seeds[0].slot=[1]", "describes no network"),
    ],
)
def test_a_damaged_or_hostile_network_folder_is_one_line_and_runs_no_code(tmp_path, case, expected):
    folder = _damaged(tmp_path, case)
    with pytest.raises(ValueError) as err:
        load_grown(folder)
    message = str(err.value)
    assert expected in message and "\n" not in message, message
    assert "will likely succeed" not in message and "add_safe_globals" not in message  # torch's advice is not repeated
    assert not (tmp_path / "ran").exists()


def test_a_mask_the_weights_do_not_hold_is_bounded_before_it_is_built(tmp_path):
    """A banded transformer builds a seq_len x seq_len mask per layer that weights.pt never holds: a small file whose
    JSON asks for a long context must be refused by bytes before the masks are allocated (issue 69, item 1)."""
    from esper_ray.contracts.host import Topology
    from esper_ray.morpho.grown import empty_grown_network
    from esper_ray.morpho.grown_artifact import MAX_DERIVED_BYTES

    config = {"seq_len": 8192, "d_model": 4, "n_heads": 1, "n_layers": 2}  # 2 x 64 MiB of mask, 0.3 MB of weights
    save_grown_network(tmp_path / "net", empty_grown_network(Topology.TRANSFORMER, config, []), {})
    architecture = tmp_path / "net" / ARCHITECTURE_FILE
    described = json.loads(architecture.read_text())  # the mask is not persistent: the same weights fit a window
    architecture.write_text(
        json.dumps({**described, "host_config": {**described["host_config"], "attention_window": 1}})
    )
    assert (tmp_path / "net" / WEIGHTS_FILE).stat().st_size < 2**20
    with pytest.raises(ValueError) as err:
        load_grown(tmp_path / "net")
    message = str(err.value)
    assert f"{2 * 8192 * 8192:,} bytes of buffers" in message and f"{MAX_DERIVED_BYTES:,}" in message, message
    assert "\n" not in message


# ------------------------------------------------------------------------------------- summary.md, no Ray
def summary_architecture(task: str, seeds: list[dict] | None = None) -> dict:
    """An architecture description as save_grown_run writes one (the run's parts summary.md reads), for `task`'s own
    host and input; `seeds`: the kept seeds (none: the host alone)."""
    from esper_ray.contracts import registry
    from esper_ray.morpho.hosts import topology_of
    from esper_ray.train.commands.grow import input_description

    registry.load_plugins(["tests.plugin_parts"])  # toy-blobs: a vector host's own features
    data = load_task_data(task)
    seeds = seeds or []
    run = {
        "task": task,
        "host_preset": task,
        "controller": "test",
        "seed": 0,
        "max_epochs": 2,
        "epochs": 2,
        "ended_by_rollback": False,
        "device": "cpu",
        "amp": "fp32",
        "test_accuracy": 0.5,
        "test_accuracy_with_probation": 0.5,
        "params_dropped_on_probation": 0,
        "test_loss": 1.0,
        "initial_val_accuracy": 0.1,
        "final_val_accuracy": 0.5,
        "val_accuracy_by_epoch": [0.1, 0.3, 0.5],
        "train_accuracy_by_epoch": [None, 0.2, 0.4],
    }
    slots = {
        s["slot"]: {
            "stage": "FOSSILIZED",
            "blueprint": "mlp",
            "in_network": True,
            "germinated_epoch": 1,
            "fossilized_epoch": 2,
        }
        for s in seeds
    }
    kept = sum(s["params"] for s in seeds)
    return {
        "topology": topology_of(task),
        "host": task,
        "contents": "the committed model",
        "seeds": seeds,
        "params": {"host": 100, "seeds": kept, "total": 100 + kept},
        "run": run,
        "input": input_description(data, data.test_x[0]),
        "slots": slots,
    }


def use_it_block(task: str) -> str:
    from esper_ray.train.commands.grow_summary import summary_markdown

    return summary_markdown(Path("net"), summary_architecture(task)).split("## Use it")[1].split("```")[1]


@pytest.mark.parametrize(
    "task, said",
    [
        ("digits", "x = (raw.float() / 16.0 - mean) / std  # raw: [B, 1, 8, 8] images as the task stores them"),
        ("text", "logits = net(tokens)  # tokens: [B, T] int64 token ids (0..255), T <= 64; logits [B, T, 256]"),
        ("toy-blobs", "x = raw.float() / 1.0  # raw: [B, 16] float features as the task stores them"),
    ],
)
def test_summary_usage_feeds_each_kind_of_input_as_its_network_takes_it(task, said):
    """A CNN host's network takes normalised images, a text host's token ids, a vector host's float features."""
    block = use_it_block(task)
    assert said in block, block
    assert ("tokens" in block) == (task == "text") and ("logits = net(x)  # [B, classes]" in block) == (task != "text")


def test_a_saved_network_with_no_kept_seed_says_it_is_the_host_alone(tmp_path):
    from esper_ray.train.commands.grow import saved_line
    from esper_ray.train.commands.grow_summary import summary_markdown

    note = "no seed was kept (none was fossilized by the run's end): this is the host alone"
    alone = summary_architecture("digits")
    grown = summary_architecture("digits", [{"slot": "r0c1", "blend": "add", "alpha": 1.0, "params": 40}])
    assert f"**N{note[1:]}.**" in summary_markdown(tmp_path, alone)
    assert "no seed" not in summary_markdown(tmp_path, grown)
    for architecture, says in ((alone, True), (grown, False)):
        (tmp_path / ARCHITECTURE_FILE).write_text(json.dumps(architecture))
        assert (note in saved_line(tmp_path)) == says
