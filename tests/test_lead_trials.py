"""The A/B's trial generator: the lead (PPO) trials all start before Tune creates a later trial (lead_trials.py)."""

from __future__ import annotations

import time

import pytest
import ray
import ray.cloudpickle as cloudpickle
from ray import tune
from ray.tune.experiment import Experiment, Trial

from esper_ray.contracts.controllers import ControllerKind
from esper_ray.experiments.lead_trials import LeadTrialsFirst, ShowTrials
from esper_ray.experiments.runner import tune_config
from esper_ray.experiments.spec import ExperimentSpec, start_order


def _noop(config):
    pass


def generator(leads: int, trials: int, max_concurrent: int = 0) -> LeadTrialsFirst:
    gen = LeadTrialsFirst(leads=leads, max_concurrent=max_concurrent)
    gen.add_configurations([Experiment("lead_test", _noop, config={"i": tune.grid_search(list(range(trials)))})])
    return gen


def test_later_trials_wait_until_every_lead_has_started():
    gen = generator(leads=2, trials=4)
    first, second = gen.next_trial(), gen.next_trial()
    assert [first.config["i"], second.config["i"]] == [0, 1]
    assert gen.next_trial() is None  # both leads pending
    first.set_status(Trial.RUNNING)
    assert gen.next_trial() is None  # one still pending
    second.set_status(Trial.ERROR)  # a lead that failed before it ran holds nothing back
    third = gen.next_trial()
    assert third.config["i"] == 2
    assert gen.next_trial().config["i"] == 3  # later trials never wait for each other
    assert gen.next_trial() is None and gen.is_finished()


def test_without_leads_trials_come_in_grid_order_at_once():
    gen = generator(leads=0, trials=3)
    assert [gen.next_trial().config["i"] for _ in range(3)] == [0, 1, 2]


def test_the_cap_holds_trials_back_until_one_completes():
    gen = generator(leads=0, trials=3, max_concurrent=2)
    first, _ = gen.next_trial(), gen.next_trial()
    assert gen.next_trial() is None
    gen.on_trial_complete(first.trial_id)
    assert gen.next_trial().config["i"] == 2


def test_a_restored_generator_creates_each_trial_once_and_holds_back_until_its_restored_leads_start():
    gen = generator(leads=3, trials=5)
    lead_a, lead_b = gen.next_trial(), gen.next_trial()  # the run stops before its third lead was created
    lead_a.set_status(Trial.RUNNING)
    state = cloudpickle.loads(cloudpickle.dumps(gen.get_state()))  # as Tune's experiment checkpoint keeps it
    assert "_lead_trials" not in state

    restored = LeadTrialsFirst(leads=3)
    restored.set_state(state)
    assert restored.created == 2
    ShowTrials(restored).on_step_begin(iteration=0, trials=[lead_a, lead_b])  # Tune's restored trials, each step
    lead_c = restored.next_trial()
    assert lead_c.config["i"] == 2  # the last lead, once
    assert restored.next_trial() is None  # lead_b is still pending, and so is lead_c
    lead_b.set_status(Trial.RUNNING)
    lead_c.set_status(Trial.RUNNING)
    assert [restored.next_trial().config["i"] for _ in range(2)] == [3, 4]
    assert restored.next_trial() is None and restored.is_finished()


def test_the_tuners_pickle_keeps_the_callback_on_its_generator_and_holds_no_live_trial():
    gen = generator(leads=1, trials=2)
    gen.next_trial()
    search_alg, callback = cloudpickle.loads(cloudpickle.dumps((gen, ShowTrials(gen))))  # as tuner.pkl holds them
    assert callback.generator is search_alg and search_alg._lead_trials == []
    assert len(search_alg._lead_ids) == 1


def test_a_generator_pickled_before_lead_ids_were_kept_holds_nothing_back():
    gen = generator(leads=1, trials=2)
    gen.next_trial()
    old = cloudpickle.loads(cloudpickle.dumps(gen))
    del old.__dict__["_lead_ids"]
    restored = cloudpickle.loads(cloudpickle.dumps(old))
    ShowTrials(restored).on_step_begin(iteration=0, trials=[])
    assert restored.next_trial().config["i"] == 1


def test_leads_must_be_a_count():
    with pytest.raises(ValueError, match="leads=-1"):
        LeadTrialsFirst(leads=-1)


def test_the_ab_tune_config_leads_with_its_ppo_trials_and_keeps_the_cap():
    spec = ExperimentSpec.from_mapping(
        {
            "name": "t",
            "arms": {
                "ppo": {"controller": "ppo"},
                "none": {"controller": "none"},
                "heuristic": {"controller": "heuristic"},
            },
            "compare": [["ppo", "none"]],
            "seeds": [0, 1, 2],
            "rounds": 1,
            "max_concurrent_trials": 4,
        }
    )
    ordered = start_order(spec.trials(), order_seed=5)
    alg = tune_config(spec, ordered).search_alg
    assert isinstance(alg, LeadTrialsFirst)
    assert alg.leads == 3 and all(t.controller is ControllerKind.PPO for t in ordered[: alg.leads])
    assert alg.max_concurrent == 4


@pytest.fixture(scope="module")
def ray_one_gpu():
    """A local Ray declaring one GPU (Ray only counts it), so trials of two sizes compete for its shares."""
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _timed(config):
    tune.report({"started_at": time.time()})
    time.sleep(config["t"]["seconds"])


def test_tune_runs_every_trial_once_its_leads_first(ray_one_gpu, tmp_path):
    """Leads ask half the GPU (two at a time), the later trials an eighth: Tune asks the generator again after it
    held a trial back, runs every trial once, and starts no later trial before the last lead."""
    trials = [{"i": i, "lead": True, "seconds": 1.0} for i in range(4)] + [
        {"i": 4 + i, "lead": False, "seconds": 0.2} for i in range(4)
    ]

    def resources(config):
        return tune.PlacementGroupFactory([{"CPU": 0.2, "GPU": 0.5 if config["t"]["lead"] else 0.125}])

    tuner = tune.Tuner(
        tune.with_resources(_timed, resources),
        param_space={"t": tune.grid_search(trials)},
        tune_config=tune.TuneConfig(num_samples=1, search_alg=LeadTrialsFirst(leads=4)),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    frame = tuner.fit().get_dataframe()
    assert sorted(frame["config/t/i"]) == list(range(8))
    started = dict(zip(frame["config/t/i"], frame["started_at"]))
    assert max(started[i] for i in range(4)) <= min(started[i] for i in range(4, 8))
