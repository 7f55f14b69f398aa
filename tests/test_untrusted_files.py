"""Files others hand you run none of the code they name (issue 74): a grown network's folder (`load_grown`) imports
only the plug-ins its caller passes, and `esper-ray report` reads a run folder's JSON and text only.

Each hostile file here names a module of a temporary folder on sys.path that leaves a marker file when it is
imported, when its register function is called, and when its host or task loader is built or called."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

import esper_ray
from esper_ray.cli import main
from esper_ray.contracts import registry
from esper_ray.contracts.actions import BlendAlgorithm, Blueprint
from esper_ray.contracts.host import Topology
from esper_ray.contracts.stages import Stage
from esper_ray.morpho.blueprints import build_seed
from esper_ray.morpho.grown import GrownNetwork, GrownSeed, GrownSeedSpec
from esper_ray.morpho.grown_artifact import save_grown_network
from esper_ray.morpho.hosts import rebuild_host
from esper_ray.train.commands.grow_summary import usage_lines
from tests.plugin_parts import ToyMLP

REPO = Path(__file__).resolve().parents[1]

MARKING_MODULE = '''
import pathlib
MARKS = pathlib.Path({marks!r})
MARKS.mkdir(exist_ok=True)
(MARKS / "imported").write_text("")
import esper_ray
from tests.plugin_parts import ToyMLP

esper_ray.register_host({host!r}, ToyMLP)


def register():
    (MARKS / "registered").write_text("")


class Host(ToyMLP):
    def __init__(self, *args, **kwargs):
        (MARKS / "host built").write_text("")
        super().__init__(*args, **kwargs)


def load(context):
    (MARKS / "task loaded").write_text("")
    raise RuntimeError("never reached")
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """(module name, the host name it registers, its marks folder): a fresh module on sys.path, not imported yet."""
    name = f"marking_{uuid.uuid4().hex[:8]}"
    host = f"marked-mlp-{name[-8:]}"
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / f"{name}.py").write_text(MARKING_MODULE.format(marks=str(tmp_path / "marks"), host=host))
    monkeypatch.syspath_prepend(str(folder))
    yield name, host, tmp_path / "marks"
    sys.modules.pop(name, None)


def marks(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def plugin_network(host_name: str, plugins: list[str]) -> GrownNetwork:
    """A ToyMLP host with a kept seed, recorded as the plug-in host `host_name` (its module is not imported here)."""
    torch.manual_seed(0)
    host = ToyMLP()
    host.registered_name = host_name
    spec = GrownSeedSpec("h1", Blueprint.MLP, BlendAlgorithm.ADD, 0.75, Stage.FOSSILIZED)
    seed = build_seed(Blueprint.MLP, 16, Topology.VECTOR)
    for p in seed.parameters():
        torch.nn.init.normal_(p, std=0.3)  # not the identity: the reload must bring the weights
    return GrownNetwork(host, {"h1": GrownSeed(spec, seed, None)}, plugins).eval()


def test_load_grown_imports_no_plugin_the_file_names_and_refuses_in_one_line_naming_them(plugin, tmp_path):
    module, host, marked = plugin
    for host_name, plugins in ((host, [module, f"{module}:register"]), (f"{module}:Host", [])):
        folder = tmp_path / host_name.replace(":", "_")
        save_grown_network(folder, plugin_network(host_name, plugins), {})
        with pytest.raises(ValueError) as refused:
            esper_ray.load_grown(folder)
        message = str(refused.value)
        assert len(message.splitlines()) == 1, message
        assert f"host {host_name!r}" in message and "not registered in this process" in message
        assert f"esper_ray.load_grown({str(folder)!r}, plugins=[{module!r}" in message, message
        assert all(repr(p) in message for p in plugins)
        assert marks(marked) == [] and module not in sys.modules  # nothing the file names ran


def test_load_grown_with_the_callers_plugins_imports_exactly_those_and_loads(plugin, tmp_path):
    module, host, marked = plugin
    network = plugin_network(host, [module, f"{module}:register"])
    save_grown_network(tmp_path / "net", network, {})
    x = torch.randn(3, 16)
    loaded = esper_ray.load_grown(tmp_path / "net", plugins=[module])
    assert torch.equal(loaded(x), network(x)) and loaded.plugins == (module, f"{module}:register")
    assert marks(marked) == ["imported"]  # the module the caller passed; not the file's register function
    # a host named by its import string: resolved only because the caller passed its module, and a host class
    network = plugin_network(f"{module}:ToyMLP", [])
    save_grown_network(tmp_path / "by_import_string", network, {})
    assert torch.equal(esper_ray.load_grown(tmp_path / "by_import_string", plugins=[module])(x), network(x))
    save_grown_network(tmp_path / "a_function", plugin_network(f"{module}:register", []), {})
    with pytest.raises(ValueError, match=r"host '.*:register' not registered in this process"):
        esper_ray.load_grown(tmp_path / "a_function", plugins=[module])
    assert marks(marked) == ["imported"]


def test_load_grown_refuses_plugins_given_as_a_string_and_names_a_missing_one_without_rays_workers(tmp_path):
    with pytest.raises(ValueError, match=r"load_grown\(plugins='my_mlp'\): expected a list of import strings"):
        esper_ray.load_grown(tmp_path, plugins="my_mlp")
    save_grown_network(tmp_path / "net", plugin_network("toy-mlp", []), {})
    with pytest.raises(ValueError) as refused:
        esper_ray.load_grown(tmp_path / "net", plugins=["no_such_module_anywhere"])
    message = str(refused.value)
    assert (
        message.startswith("load_grown(plugins=...): 'no_such_module_anywhere' cannot be imported")
        and "Ray" not in message
    )


def test_registered_host_never_resolves_an_import_string_and_rebuild_host_refuses_one(plugin):
    module, _, marked = plugin
    assert registry.registered_host("os:getcwd") is None and registry.registered_host(f"{module}:Host") is None
    with pytest.raises(ValueError, match="not registered in this process"):
        rebuild_host(f"{module}:Host", {})
    assert marks(marked) == [] and f"{module}:Host" not in registry.host_names()
    assert registry.registered_host("digits").builtin  # a built-in name is found


def test_standard_library_names_in_a_grown_network_or_a_run_folder_never_run(tmp_path):
    """os:abort would end the process, sys:exit the caller's script, faulthandler:_sigsegv crash it."""
    save_grown_network(
        tmp_path / "net", plugin_network("faulthandler:_sigsegv", ["os:abort", "sys:exit", "pdb:set_trace"]), {}
    )
    run = run_folder(
        tmp_path / "run",
        {"plugins": ["os:abort", "sys:exit"], "env": {"host_preset": "faulthandler:_sigsegv"}},
        task="os:abort",
    )
    script = (
        "import sys, esper_ray\nfrom esper_ray.cli import main\n"
        "try:\n    esper_ray.load_grown(sys.argv[1])\nexcept ValueError as err:\n    print('refused:', err)\n"
        "print('report', main(['report', sys.argv[2]]))\nprint('survived')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "net"), str(run)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.splitlines()[-2:] == ["report 0", "survived"], done.stderr[-2000:]
    assert "refused:" in done.stdout and "'os:abort'" in done.stdout


def test_a_plugin_networks_summary_shows_how_to_load_it_with_its_plugins():
    tokens = {"input": {"kind": "tokens", "shape": [16]}}
    assert "esper_ray.load_grown('net')  #" in "\n".join(
        usage_lines(Path("net"), {**tokens, "host": "text", "plugins": []})
    )
    lines = "\n".join(usage_lines(Path("net"), {**tokens, "host": "my_mlp:MyMLP", "plugins": ["my_parts"]}))
    assert "esper_ray.load_grown('net', plugins=['my_parts', 'my_mlp'])" in lines


# ------------------------------------------------------------------------------------------------------ report
def run_folder(out: Path, training: dict, task: str = "digits", held_out: list | str | None = None) -> Path:
    """A finished `esper-ray ab` run folder as the runner writes it (experiment.json, Tune's JSON), with `training`
    (and `task`) as its experiment file's training settings: three arms, two seeds, every trial finished."""
    experiment = {
        "name": "untrusted",
        "seeds": [0, 1],
        "rounds": 1,
        "last_rounds": 1,
        "eval_episodes": 1,
        "alpha": 0.05,
        "metric": "test_accuracy",
        "order_seed": 1,
        "training": {"task": task, **training},
        "arms": {
            "ppo": {"controller": "ppo"},
            "none": {"controller": "none"},
            "fix": {"controller": "fixed", "fixed": {"blueprint": "conv_heavy", "slot": "r0c1"}},
        },
        **({"held_out": held_out} if held_out is not None else {}),
    }
    order = [(arm, seed) for arm in experiment["arms"] for seed in experiment["seeds"]]
    tune = out / "tune"
    tune.mkdir(parents=True)
    (out / "experiment.json").write_text(
        json.dumps(
            {
                "experiment": experiment,
                "source": None,
                "order_seed": 1,
                "order_seed_drawn": False,
                "start_order": [{"position": i, "arm": a, "seed": s} for i, (a, s) in enumerate(order)],
            }
        )
    )
    trials = []
    for i, (arm, seed) in enumerate(order):
        name = f"{arm}_seed{seed}_abcde_{i:05d}"
        (tune / name).mkdir()
        evaluation = {
            f"eval/{c}": 0.5 + 0.01 * i
            for c in (
                "test_accuracy",
                "test_accuracy_per_param",
                "val_accuracy",
                "val_accuracy_per_param",
                "params_added",
                "host_params",
                "episodes",
            )
        }
        hosts = held_out if isinstance(held_out, list) else []
        evaluation.update(
            {f"eval/{c}/{h['name']}": 0.4 + 0.01 * i for h in hosts for c in ("test_accuracy", "host_runs")}
        )
        summary = (
            {
                f"round/{c}": 0.1
                for c in (
                    "round",
                    "final_accuracy",
                    "params_added",
                    "host_params",
                    "episode_return",
                    "episodes",
                    "seconds",
                )
            }
            if arm == "ppo"
            else {}
        )
        row = {"training_iteration": 1, "timestamp": 10.0, "time_this_iter_s": 1.0, **summary, **evaluation}
        (tune / name / "result.json").write_text(json.dumps(row) + "\n")
        trials.append(
            [
                json.dumps(
                    {
                        "trial_id": f"abcde_{i:05d}",
                        "status": "TERMINATED",
                        "relative_logdir": name,
                        "config": {"trial": {"arm": arm, "seed": seed}},
                    }
                ),
                json.dumps({}),
            ]
        )
    (tune / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": trials}))
    return out


def test_report_of_a_run_folder_naming_plugins_and_import_strings_imports_none_of_them(plugin, tmp_path, capsys):
    module, _, marked = plugin
    hostile = {
        "plugins": [module, f"{module}:register"],
        "slots": ["r0c0", "r0c1"],
        "env": {"host_preset": f"{module}:Host"},
    }
    held_out = [
        {"name": "elsewhere", "env": {"plugins": [module], "host_preset": f"{module}:Host", "task": f"{module}:load"}}
    ]
    for i, (task, hosts) in enumerate(((f"{module}:load", None), ("digits", held_out))):
        out = run_folder(tmp_path / f"run{i}", hostile, task=task, held_out=hosts)
        assert main(["report", str(out)]) == 0, capsys.readouterr().err
        report = (out / "report.md").read_text()
        assert "fix = fixed(conv_heavy@r0c1)" in report and "| ppo | 8 host runs of 25 epochs per run seed" in report
        assert marks(marked) == [] and module not in sys.modules, marks(marked)
        results = json.loads((out / "results.json").read_text())
        assert results["trials"][0]["config"]["plugins"] == hostile["plugins"]  # reported as data, as recorded
    assert "### Host `elsewhere`" in report


def test_the_line_printed_after_saving_a_plugin_network_passes_its_plugins(tmp_path):
    from esper_ray.train.commands.grow import saved_line

    save_grown_network(tmp_path / "net", plugin_network("toy-mlp", ["tests.plugin_parts"]), {})
    assert f"esper_ray.load_grown({str(tmp_path / 'net')!r}, plugins=['tests.plugin_parts'])" in saved_line(
        tmp_path / "net"
    )


def test_report_of_a_run_whose_held_out_family_no_module_here_registers_says_it_imports_no_plugin(tmp_path, capsys):
    out = run_folder(tmp_path / "run", {}, held_out="a-plugins-family")
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(out)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert "held_out='a-plugins-family'" in err and "imports no plug-in a run folder names" in err
