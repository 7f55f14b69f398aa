"""Your own task, host and blueprint (contracts/registry.py, docs/plugins.md): registered by a module outside
esper_ray (tests/plugin_parts.py), found by name in every process, Ray's workers included, and recorded so that a
checkpoint evaluates and a saved network reloads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import esper_ray
from esper_ray.cli import main
from esper_ray.contracts import registry
from esper_ray.contracts.env_config import EnvConfig
from esper_ray.contracts.host import SlotSpec, Topology
from esper_ray.data.datasets import TaskContext
from esper_ray.data.task_loading import load_task, task_data_from
from esper_ray.env.morphogenetic_env import MorphogeneticEnv
from esper_ray.morpho.blueprints import build_seed
from esper_ray.morpho.hosts import build_host, rebuild_host

REPO = Path(__file__).resolve().parents[1]
PLUGIN = "tests.plugin_parts"
TOY = {"task": "toy-blobs", "plugins": [PLUGIN], "slots": ["h0", "h1", "h2"]}


# ------------------------------------------------------------------------------------------- the registry
def test_unknown_names_list_the_registered_ones_in_one_line():
    for lookup, match in (
        (lambda: registry.task("nope"), "task='nope': unknown; choose one of .*'digits'"),
        (lambda: registry.host("nope"), "host='nope': unknown; choose one of .*'cifar10'"),
        (lambda: registry.blueprint("vector", "conv_heavy"), "not available for vector hosts; available: .*mlp"),
    ):
        with pytest.raises(ValueError, match=match) as err:
            lookup()
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="task='nope': unknown"):
        EnvConfig(task="nope")


def test_a_blueprint_for_an_unknown_topology_is_refused_naming_the_topologies():
    """A new name is welcome (tests/test_plugin_blueprints.py); a topology no host has is not."""
    with pytest.raises(ValueError, match="topology='graph'; choose one of"):
        registry.register_blueprint("mlp", "graph", lambda c, m: torch.nn.Identity())


def test_a_task_and_a_host_may_be_named_by_their_import_string():
    cfg = EnvConfig(task="tests.plugin_parts:load_blobs", host_preset="tests.plugin_parts:ToyMLP", slots=("h0", "h2"))
    assert cfg.effective_host_preset == "tests.plugin_parts:ToyMLP"
    env = MorphogeneticEnv({"task": cfg.task, "host_preset": cfg.host_preset, "slots": ["h0", "h2"], "max_epochs": 2})
    env.reset(seed=0)
    assert env.slot_ids == ["h0", "h2"] and env.data.num_classes == 4
    with pytest.raises(ValueError, match=r"host_preset='tests.plugin_parts:nope': .*has no 'nope'"):
        EnvConfig(task="tests.plugin_parts:load_blobs", host_preset="tests.plugin_parts:nope")


def test_a_task_registered_with_bad_defaults_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="task 'bad': batch_size=0; must be an integer >= 1"):
        esper_ray.register_task("bad", "tests.plugin_parts:load_blobs", batch_size=0)
    with pytest.raises(ValueError, match="task 'bad': loss='regression'; choose one of"):
        esper_ray.register_task("bad", "tests.plugin_parts:load_blobs", loss="regression")
    with pytest.raises(ValueError, match=r"hosts='toy-mlp'; give a list of host names"):
        esper_ray.register_task("bad", "tests.plugin_parts:load_blobs", hosts="toy-mlp")


def test_registering_a_name_again_is_a_no_op_for_the_same_part_and_refused_for_another():
    import tests.plugin_parts as parts

    esper_ray.register_host("toy-mlp", parts.ToyMLP, width=16)  # the module imported a second time
    with pytest.raises(ValueError, match="host 'toy-mlp' is registered already .*pick another name"):
        esper_ray.register_host("toy-mlp", parts.ToyMLP, width=32)
    with pytest.raises(ValueError, match="task 'digits' is registered already"):
        esper_ray.register_task("digits", parts.load_blobs)


def test_a_plugin_that_cannot_be_imported_is_one_line_naming_it():
    with pytest.raises(ValueError, match=r"plugins: 'no_such_pkg.parts' cannot be imported .*PYTHONPATH"):
        EnvConfig(plugins=("no_such_pkg.parts",))
    with pytest.raises(ValueError, match="has no function 'missing'"):
        registry.load_plugins(["tests.plugin_parts:missing"])


def test_the_builtin_parts_register_through_the_same_registry():
    assert registry.task_names(builtin_only=True) == ["digits", "digits-impaired", "cifar10", "synthetic", "text"]
    assert registry.host("digits").builtin and registry.task("text").loss == "tokens"
    assert build_host("cifar10").registered_name == "cifar10"
    assert EnvConfig(task="text", host_preset="text-starved").effective_host_preset == "text-starved"


# ---------------------------------------------------------------------------------------- hosts and seeds
def test_a_host_declares_its_slots_and_is_rebuilt_from_its_json_description():
    EnvConfig(**TOY)  # imports the plugin
    host = build_host("toy-mlp")
    assert host.slots() == [SlotSpec(f"h{i}", (16,), Topology.VECTOR) for i in range(3)]
    assert host.topology is Topology.VECTOR and host.slot_channels("h1") == 16
    description = json.loads(json.dumps(host.describe()))
    again = rebuild_host("toy-mlp", {**description, "width": 8})
    assert type(again) is type(host) and again.slot_shape("h0") == (8,)
    with pytest.raises(ValueError, match="slot 'r0c0' does not exist in this host; available slots: \\['h0'"):
        host.slot_spec("r0c0")


def test_a_slot_with_a_shape_its_topology_cannot_have_is_refused():
    with pytest.raises(ValueError, match=r"slot 'h0': shape=\(8, 8\); a vector slot's features are 1 positive"):
        SlotSpec("h0", (8, 8), "vector")
    with pytest.raises(ValueError, match="topology='graph'; choose one of"):
        SlotSpec("h0", (8,), "graph")


@pytest.mark.parametrize("name", registry.blueprint_names("vector"))
@pytest.mark.parametrize("multiply", [False, True])
def test_vector_seeds_keep_the_shape_start_near_the_identity_and_get_a_gradient(name, multiply):
    EnvConfig(**TOY)
    torch.manual_seed(0)
    seed = build_seed(name, 16, Topology.VECTOR, multiply=multiply)
    x = torch.randn(5, 16)
    out = seed(x)
    assert out.shape == x.shape
    assert torch.allclose(out, x, atol=0.06 * x.abs().max().item())  # attention: x * sigmoid(3)
    out.pow(2).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in seed.parameters())


# ---------------------------------------------------------------------------------------------------- data
def test_a_task_given_as_arrays_or_as_datasets_gives_the_same_data():
    from tests.plugin_parts import blob_splits

    splits = blob_splits()
    as_arrays = task_data_from("blobs", splits)
    datasets = {
        k: torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y)) for k, (x, y) in splits.items()
    }
    as_datasets = task_data_from("blobs", datasets)
    assert as_arrays.train_x.dtype == torch.float32 and as_arrays.num_classes == 4
    assert torch.equal(as_arrays.train_x, as_datasets.train_x) and torch.equal(as_arrays.test_y, as_datasets.test_y)
    assert torch.equal(as_arrays.prepare(as_arrays.val_x[:3]), as_arrays.val_x[:3])  # features as they are


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda s: {k: v for k, v in s.items() if k != "test"}, r"expected TaskData or a mapping with the splits"),
        (lambda s: {**s, "train": (s["train"][0], s["train"][1][:10])}, "x has 256 rows and y 10"),
        (
            lambda s: {**s, "train": (s["train"][0], s["train"][1].astype(float))},
            "y is torch.float64; labels are integers",
        ),
        (lambda s: {**s, "num_classes": 2}, "num_classes=2; must be an integer above the largest label 3"),
    ],
)
def test_bad_task_data_is_one_line_naming_the_task_and_split(change, match):
    from tests.plugin_parts import blob_splits

    with pytest.raises(ValueError, match=match) as err:
        task_data_from("blobs", change(blob_splits()))
    assert "\n" not in str(err.value)


def test_a_token_task_takes_labels_per_position():
    x = np.random.default_rng(0).integers(0, 7, size=(8, 5))
    data = task_data_from("seq", {s: (x, x) for s in ("train", "validation", "test")}, tokens=True)
    assert data.tokens and data.train_x.dtype == torch.int64 and data.num_classes == 7
    with pytest.raises(ValueError, match=r"y has shape \(8,\); loss tokens takes \[N, T\]"):
        task_data_from("seq", {s: (x, x[:, 0]) for s in ("train", "validation", "test")}, tokens=True)


# ----------------------------------------------------------------------------------------------- the env
def test_an_env_grows_the_plugin_host_on_the_plugin_task_with_the_vector_blueprints():
    env = MorphogeneticEnv({**TOY, "max_epochs": 3})
    obs, _ = env.reset(seed=0)
    assert env.slot_ids == ["h0", "h1", "h2"] and env.topology is Topology.VECTOR
    assert {b.key for b in env.blueprints} == {"norm", "attention", "lora", "mlp_small", "mlp", "bottleneck"}
    assert env.observation_space.contains(obs)
    for _ in range(3):
        obs, reward, terminated, _, info = env.step(env.action_space.sample())
        assert np.isfinite(reward) and env.observation_space.contains(obs) and info["flops/train"] > 0
    assert terminated and load_task("toy-blobs", TaskContext()).num_classes == 4


def test_a_plugin_host_on_a_builtin_task_and_a_task_without_a_host_name_what_fits():
    with pytest.raises(
        ValueError, match=r"host_preset=None: task toy-blobs-nohost takes one of \[\] or a plug-in's host"
    ):
        esper_ray.register_task("toy-blobs-nohost", "tests.plugin_parts:load_blobs")
        EnvConfig(task="toy-blobs-nohost", plugins=(PLUGIN,), slots=("h0",))
    with pytest.raises(
        ValueError, match=r"host_preset='text-gpu': task digits takes one of \['digits'\] or a plug-in's host"
    ):
        EnvConfig(task="digits", host_preset="text-gpu", plugins=(PLUGIN,))
    with pytest.raises(ValueError, match="mask_cut_off=True: needs slots named r{row}c{col}"):
        MorphogeneticEnv({**TOY, "mask_cut_off": True})


def test_a_saved_network_of_a_plugin_host_and_seed_reloads_bit_for_bit_in_a_fresh_process(tmp_path):
    from esper_ray.contracts.actions import BlendAlgorithm, Blueprint
    from esper_ray.contracts.stages import Stage
    from esper_ray.morpho.grown import GrownNetwork, GrownSeed, GrownSeedSpec
    from esper_ray.morpho.grown_artifact import save_grown_network

    EnvConfig(**TOY)
    torch.manual_seed(0)
    seeds = {}
    for slot, blueprint, blend in (
        ("h1", Blueprint.BOTTLENECK, BlendAlgorithm.ADD),
        ("h2", Blueprint.MLP, BlendAlgorithm.GATE),
    ):
        spec = GrownSeedSpec(slot, blueprint, blend, 0.75, Stage.FOSSILIZED)
        seed = build_seed(blueprint, 16, Topology.VECTOR)
        for p in seed.parameters():
            torch.nn.init.normal_(p, std=0.3)  # not the identity any more: the reload must bring the weights
        gate = None
        if blend is BlendAlgorithm.GATE:
            from esper_ray.morpho.blend import GatedBlend

            gate = GatedBlend(16, Topology.VECTOR)
        seeds[slot] = GrownSeed(spec, seed, gate)
    network = GrownNetwork(build_host("toy-mlp"), seeds, plugins=[PLUGIN]).eval()
    save_grown_network(tmp_path / "net", network, {})
    x = torch.randn(3, 16)
    torch.save(network(x).detach(), tmp_path / "expected.pt")
    torch.save(x, tmp_path / "x.pt")
    check = (
        "import sys, torch, esper_ray; net = esper_ray.load_grown(sys.argv[1] + '/net', plugins=[sys.argv[2]]); "
        "x = torch.load(sys.argv[1] + '/x.pt'); assert torch.equal(net(x), torch.load(sys.argv[1] + '/expected.pt')); "
        "print(type(net.host).__name__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", check, str(tmp_path), PLUGIN], cwd=REPO, capture_output=True, text=True, timeout=120
    )  # the caller names the plug-in it trusts: the file's list is never imported
    assert done.returncode == 0 and done.stdout.strip() == "ToyMLP", done.stderr[-2000:]


# ----------------------------------------------------------------------------- on a local Ray, through the CLI
def _yaml(path: Path, content: dict) -> Path:
    path.write_text(yaml.safe_dump(content))
    return path


@pytest.mark.expensive
def test_a_plugin_reaches_rays_workers_in_train_eval_and_ab_and_its_network_reloads(ray_local, tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--plugins",
                PLUGIN,
                "--task",
                "toy-blobs",
                "--slots",
                "h0",
                "h1",
                "h2",
                "--rounds",
                "1",
                "--envs",
                "1",
                "--cpus-per-env",
                "0.5",
                "--max-epochs",
                "3",
                "--episodes-per-env",
                "1",
                "--output",
                str(run),
            ]
        )
        == 0
    )  # the env runner is a Ray actor: it imported the plugin to build its env
    capsys.readouterr()
    assert json.loads((run / "config.json").read_text())["plugins"] == [PLUGIN]
    assert main(["eval", "--checkpoint", str(run), "--save", str(tmp_path / "grown"), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    architecture = json.loads((tmp_path / "grown" / "architecture.json").read_text())
    assert (
        architecture["host"] == "toy-mlp"
        and architecture["plugins"] == [PLUGIN]
        and architecture["topology"] == "vector"
    )
    network = esper_ray.load_grown(tmp_path / "grown")
    assert network(torch.zeros(2, 16)).shape == (2, 4) and architecture["run"]["test_accuracy"] == row["test_accuracy"]
    # ab: the plugin named in the experiment file's training settings reaches every trial and its env runners
    experiment = _yaml(
        tmp_path / "toy.yaml",
        {
            "name": "toy",
            "arms": {"ppo": {"controller": "ppo"}, "heuristic": {"controller": "heuristic"}},
            "seeds": [0],
            "rounds": 1,
            "last_rounds": 1,
            "eval_episodes": 1,
            "metric": "test_accuracy",
            "alpha": 0.05,
            "order_seed": 1,
            "training": {
                "task": "toy-blobs",
                "plugins": [PLUGIN],
                "slots": ["h0", "h1", "h2"],
                "max_epochs": 3,
                "envs": 1,
                "learners": 0,
                "cpus_per_env": 0.5,
                "driver_cpus": 0.5,
                "learner_cpus": 0.5,
            },
        },
    )
    assert main(["ab", str(experiment), "--output", str(tmp_path / "ab")]) == 0
    trials = {t["arm"]: t for t in json.loads((tmp_path / "ab" / "results.json").read_text())["trials"]}
    assert sorted(trials) == ["heuristic", "ppo"]
    for t in trials.values():  # a trial whose process had not imported the plug-in ends in error (unknown task)
        assert t["status"] == "finished" and t["in_statistics"], (t["arm"], t["status"], t["error"])
        assert t["config"]["plugins"] == [PLUGIN] and 0.0 <= t["final_metric"] <= 1.0
    assert main(["report", str(tmp_path / "ab")]) == 0


# -------------------------------------------------------------------------------------------- the examples
@pytest.mark.expensive
@pytest.mark.parametrize("example", ["grow_mlp.py", "grow_cnn.py"])
def test_the_examples_grow_their_own_host_at_small_settings(example, tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / example), "--small", "--output", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reloaded the grown network" in done.stdout
    assert "esper-ray train: warning: no seed can be kept in a run of max_epochs=3" in done.stderr  # --small says so


# ----------------------------------------------------------------------------------- the command line (issue 74)
def test_a_plugin_module_in_the_folder_the_command_runs_in_is_found(tmp_path):
    """`esper-ray host --plugins my_mod` run beside my_mod.py was refused: the console script's sys.path holds its
    bin folder, not the working one (docs/plugins.md shows that command). sys.path as the console script has it."""
    parts = (REPO / "tests" / "plugin_parts.py").read_text().replace("tests.plugin_parts:", "my_mod:")  # its own name
    (tmp_path / "my_mod.py").write_text(parts)
    code = (
        "import os, sys\nsys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]\n"
        "from esper_ray.cli import main\nsys.exit(main(['host', '--plugins', 'my_mod', '--task', 'toy-blobs']))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "host toy-mlp (vector)" in done.stdout and "slots h0, h1, h2" in done.stdout


def test_a_plugin_that_raises_on_import_is_one_line_naming_it_and_where_with_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "raising_plugin_74.py").write_text("import math\nraise RuntimeError('no licence file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        main(["host", "--plugins", "raising_plugin_74"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert (
        "plugins: 'raising_plugin_74' raised RuntimeError on import: no licence file (at "
        f"{tmp_path / 'raising_plugin_74.py'}:2)"
    ) in err


def test_slots_default_to_the_plugin_hosts_own_and_ab_names_training_slots(tmp_path):
    """`train --plugins ... --task toy-blobs` asked for r0c0, r0c1, r0c2, which the plug-in's host lacks."""
    from esper_ray.cli import build_parser, train_config_from_args
    from esper_ray.experiments.spec import ExperimentSpec

    args = build_parser().parse_args(
        ["train", "--plugins", PLUGIN, "--task", "toy-blobs", "--output", str(tmp_path / "r")]
    )
    assert train_config_from_args(args)[0].slots == ("h0", "h1", "h2")
    args = build_parser().parse_args(["train", "--output", str(tmp_path / "r")])  # a built-in host keeps the default
    assert train_config_from_args(args)[0].slots == ("r0c0", "r0c1", "r0c2")
    experiment = {
        "name": "t",
        "arms": {"a": {"controller": "none"}, "b": {"controller": "heuristic"}},
        "seeds": [0, 1],
        "training": {"task": "toy-blobs", "plugins": [PLUGIN]},
    }
    assert {tuple(t.train["slots"]) for t in ExperimentSpec.from_mapping(experiment).trials()} == {("h0", "h1", "h2")}
    with pytest.raises(ValueError, match=r"^training\.slots=\['r0c0'\]: slot 'r0c0' does not exist in this host"):
        ExperimentSpec.from_mapping({**experiment, "training": {**experiment["training"], "slots": ["r0c0"]}})
    with pytest.raises(ValueError, match=r"^arms\.b\.slots=\['h9'\]: slot 'h9' does not exist"):
        ExperimentSpec.from_mapping(
            {**experiment, "arms": {"a": {"controller": "none"}, "b": {"controller": "heuristic", "slots": ["h9"]}}}
        )
