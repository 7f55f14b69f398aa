"""Config fuzzing: every invalid settings mapping raises ValueError naming the key, before Ray starts; nothing else
(TypeError, KeyError, AttributeError, ...) escapes from TrainConfig, EnvConfig or an experiment file."""

from __future__ import annotations

import dataclasses
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esper_ray.contracts.env_config import EnvConfig
from esper_ray.contracts.train_config import TrainConfig
from esper_ray.experiments.spec import ExperimentSpec

ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.lists(st.integers(-2, 3), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def mappings(cls: type, extra_keys: list[str] = ()) -> st.SearchStrategy[dict]:
    keys = st.sampled_from(field_names(cls) + list(extra_keys) + ["bogus_key"])
    return st.dictionaries(keys, ODD_VALUES, max_size=4)


def assert_clean(build, mapping: dict) -> None:
    try:
        build(mapping)
    except ValueError as err:
        named = [k for k in mapping if re.search(rf"\b{re.escape(str(k))}\b", str(err))]
        nested = re.search(r"\b(env|slots|task|reward_mode|reward_family|gamma|shard|num_shards|max_epochs|seed)\b", str(err))
        assert named or nested, f"{err!r} names none of {list(mapping)}"


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(mappings(EnvConfig))
def test_env_config_rejects_bad_mappings_with_a_value_error_naming_the_key(mapping):
    assert_clean(EnvConfig.from_mapping, mapping)


@FUZZ
@given(mappings(TrainConfig))
def test_train_config_rejects_bad_mappings_with_a_value_error_naming_the_key(mapping):
    assert_clean(TrainConfig.from_mapping, mapping)


@FUZZ
@given(st.dictionaries(st.sampled_from(field_names(EnvConfig)), ODD_VALUES, max_size=3))
def test_train_config_env_section_is_checked_the_same_way(env):
    assert_clean(lambda m: TrainConfig.from_mapping({"env": m}), env)


BASE = {"name": "f", "arms": {"a": {}, "b": {"controller": "none"}}, "seeds": [0, 1]}


@FUZZ
@given(mappings(ExperimentSpec))
def test_experiment_mappings_reject_bad_values_with_a_value_error_naming_the_key(mapping):
    assert_clean(lambda m: ExperimentSpec.from_mapping({**BASE, **m}), mapping)


@FUZZ
@given(st.dictionaries(st.sampled_from(["controller", "reward_mode", "lr", "envs", "env", "seed", "bogus"]), ODD_VALUES, max_size=3))
def test_arm_settings_are_checked_before_anything_runs(arm):
    assert_clean(lambda m: ExperimentSpec.from_mapping({**BASE, "arms": {"a": {}, "b": m}}), arm)
