"""Running on a cluster: the launcher file validates, and env runners spread over the nodes of a multi-node
cluster (ray.cluster_utils.Cluster: a head and two workers)."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = Path(__file__).resolve().parents[1]


def load_cluster_yaml() -> dict:
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def test_cluster_yaml_passes_the_ray_launcher_validation():
    config = prepare_config(load_cluster_yaml())
    validate_config(config)
    head = config["available_node_types"][config["head_node_type"]]
    gpu = config["available_node_types"]["gpu_worker"]
    assert head["resources"]["GPU"] == 0 and gpu["resources"]["GPU"] >= 1
    assert gpu["min_workers"] == 0 and gpu["max_workers"] >= 1
    assert any("--dashboard-host=127.0.0.1" in c for c in config["head_start_ray_commands"])
    ports = [p["FromPort"] for p in config["provider"]["security_group"]["IpPermissions"]]
    assert ports == [22]  # nothing but SSH is open to the outside; the dashboard goes through `ray dashboard`
    assert any("pip install" in c and "esper-ray" in c for c in config["setup_commands"])


@pytest.mark.parametrize(
    "break_it",
    [
        lambda c: c.update(max_worker=3),
        lambda c: c["available_node_types"]["gpu_worker"]["resources"].update(GPU=0.5),
        lambda c: c.update(head_node_type="nope"),
        lambda c: c["available_node_types"]["gpu_worker"].pop("resources"),
    ],
)
def test_a_broken_cluster_yaml_is_rejected(break_it):
    config = copy.deepcopy(load_cluster_yaml())
    break_it(config)
    with pytest.raises((jsonschema.ValidationError, ValueError)):  # as `ray up` would raise
        validate_config(prepare_config(config))


@pytest.fixture(scope="module")
def three_node_cluster():
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=2) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster, workers
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.expensive
def test_spread_placement_puts_env_runners_on_more_than_one_node(three_node_cluster, tmp_path):
    from esper_ray.contracts.train_config import TrainConfig
    from esper_ray.train.commands.runner import run_training

    lines: list[str] = []
    cfg = TrainConfig(
        max_epochs=3,
        envs=2,
        cpus_per_env=1,
        learners=0,
        rounds=1,
        placement="SPREAD",
        output=str(tmp_path / "spread"),
        env={"batch_size": 512},
    )
    outcome = run_training(cfg, Path(cfg.output), log=lines.append)
    placement = next(line for line in lines if line.startswith("placement SPREAD"))
    assert placement == "placement SPREAD: 2 env runners on 2 node(s)"
    assert (
        outcome.rounds[0].env_steps == 2 * cfg.episodes_per_env * 3
        and (outcome.checkpoint / "train_config.json").is_file()
    )
