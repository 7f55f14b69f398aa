"""Env processes holding fractional GPUs spread over the node's GPUs, where Ray alone stacks them on the first one
(gpu_spread.py); tested on a local Ray that declares 4 GPUs this machine does not have (nothing touches CUDA)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from esper_ray.train.process.gpu_spread import claim, least_loaded, single_visible_gpu, spread_gpu


@pytest.fixture()
def sleepers():
    """Live processes whose pids stand for env processes."""
    procs: list[subprocess.Popen] = []

    def start(n: int) -> list[int]:
        procs.extend(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(n))
        return [p.pid for p in procs[-n:]]

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_least_loaded_prefers_rays_pick_among_equals_then_the_first_listed() -> None:
    gpus = ["0", "1", "2", "3"]
    assert least_loaded(gpus, {"0": 0.5, "1": 0.25, "2": 0.25}, preferred="0") == "3"
    assert least_loaded(gpus, {"0": 0.5, "1": 0.25, "2": 0.25, "3": 0.25}, preferred="2") == "2"
    assert least_loaded(gpus, {"0": 0.5, "1": 0.25, "2": 0.25, "3": 0.25}, preferred="0") == "1"


def test_claims_of_live_processes_spread_evenly_and_dead_ones_free_their_gpu(tmp_path: Path, sleepers) -> None:
    gpus = ["0", "1", "2", "3"]
    pids = sleepers(8)
    picks = [claim(tmp_path, pid, 1 / 16, gpus, preferred="0") for pid in pids]  # Ray would say "0" to all 8
    assert collections.Counter(picks) == {gpu: 2 for gpu in gpus}

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    ledger[str(dead.pid)] = {"gpu": "3", "share": 0.5}  # a process that died holding half of GPU 3
    (tmp_path / "ledger.json").write_text(json.dumps(ledger))
    (newcomer,) = sleepers(1)
    assert claim(tmp_path, newcomer, 1 / 16, gpus, preferred="0") == "0"  # all equal again once the dead entry goes
    assert str(dead.pid) not in json.loads((tmp_path / "ledger.json").read_text())


def test_a_process_claiming_again_replaces_its_entry(tmp_path: Path) -> None:
    gpus = ["0", "1"]
    assert claim(tmp_path, os.getpid(), 0.5, gpus, preferred="0") == "0"
    assert claim(tmp_path, os.getpid(), 0.5, gpus, preferred="0") == "0"  # not counted against itself
    assert len(json.loads((tmp_path / "ledger.json").read_text())) == 1


@pytest.mark.parametrize("visible, expected", [("3", "3"), (" 1 ", "1"), ("0,1", None), ("", None), (None, None)])
def test_the_one_visible_gpu_names_a_processs_card_and_none_for_none_or_several(monkeypatch, visible, expected) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert single_visible_gpu() == expected


@pytest.fixture(scope="module")
def ray_four_gpus(tmp_path_factory):
    """A local Ray that declares 4 GPUs; its workers keep their ledger in a temp folder of this test."""
    tmp = tmp_path_factory.mktemp("ledger-tmp")
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=4,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TMPDIR": str(tmp)}},
    )
    yield tmp
    ray.shutdown()


@ray.remote(num_cpus=0)
class EnvProcess:
    def place(self) -> tuple[list[str], str | None, str, str | None]:
        ray_pick = [str(g) for g in ray.get_gpu_ids()]
        return ray_pick, spread_gpu(), os.environ.get("CUDA_VISIBLE_DEVICES", ""), single_visible_gpu()


def test_fractional_gpu_actors_spread_over_the_nodes_gpus(ray_four_gpus) -> None:
    actors = [EnvProcess.options(num_gpus=1 / 16).remote() for _ in range(8)]
    placed = ray.get([a.place.remote() for a in actors])
    assert {tuple(ray_pick) for ray_pick, _, _, _ in placed} == {("0",)}  # what Ray alone does: all on GPU 0
    assert collections.Counter(visible for _, _, visible, _ in placed) == {"0": 2, "1": 2, "2": 2, "3": 2}
    assert all(chosen == visible == named for _, chosen, visible, named in placed)  # the card its metrics name
    whole = EnvProcess.options(num_gpus=1).remote()
    ray_pick, chosen, visible, named = ray.get(whole.place.remote())
    assert chosen is None and visible == named == ray_pick[0]  # a whole GPU keeps Ray's pick
    for a in [*actors, whole]:
        ray.kill(a)
