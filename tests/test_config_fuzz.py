"""Config fuzzing: every invalid settings mapping raises ValueError naming the offending key, before Ray starts;
nothing else (TypeError, KeyError, AttributeError, ...) escapes from TrainConfig, EnvConfig or an experiment file, and
no value of the wrong kind (a string for a number, a bool for an integer, NaN, None where a value is needed, an unknown
key) is accepted."""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esper_ray.contracts.env_config import EnvConfig
from esper_ray.contracts.train_config import RUN_ENV_KEYS, TrainConfig
from esper_ray.experiments.spec import ExperimentSpec

ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-2, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def mappings(cls: type, extra_keys: list[str] = ()) -> st.SearchStrategy[dict]:
    keys = st.sampled_from(field_names(cls) + list(extra_keys) + ["bogus_key"])
    return st.dictionaries(keys, ODD_VALUES, max_size=4)


def wrong_kind(hint: Any, value: Any) -> bool:
    """Whether `value` is surely not a value of `hint`: of another kind, or not finite. (Of the right kind it may still
    be out of range: then a refusal is allowed, not required.) Written apart from contracts/fields.py's check, which
    it checks."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return all(wrong_kind(h, value) for h in args)
    if hint is type(None):
        return value is not None
    if hint is bool or hint is str:
        return not isinstance(value, hint)
    if hint is int:
        return isinstance(value, bool) or not isinstance(value, int)
    if hint is float:
        return isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
    if origin is tuple:
        return not isinstance(value, (list, tuple)) or any(wrong_kind(args[0], v) for v in value)
    if hint is Mapping or origin is Mapping:
        return not isinstance(value, Mapping)
    return False  # Any: no kind is surely wrong


def names(err: ValueError, key: Any) -> bool:
    text = str(err)
    if repr(key) in text:
        return True
    return isinstance(key, str) and key != "" and re.search(rf"\b{re.escape(key)}\b", text) is not None


ALIASES = {("amp", False)}
"""Values of another kind taken on purpose: YAML (experiment files, --env) reads `amp: off` as false."""


def assert_clean(build, mapping: dict, hints: Mapping[str, Any]) -> None:
    """`build(mapping)` refuses it with a ValueError naming one of its keys (or a key inside its `env`), and must
    refuse it where a key is unknown or a value of the wrong kind."""
    aliased = {k for k, v in mapping.items() if any(k == a and v is b for a, b in ALIASES)}
    wrong = {k: v for k, v in mapping.items() if k not in hints or wrong_kind(hints[k], v) and k not in aliased}
    try:
        build(mapping)
    except ValueError as err:
        keys = list(mapping) + list(mapping["env"] if isinstance(mapping.get("env"), Mapping) else ())
        assert any(names(err, k) for k in keys), f"{err!r} names none of {keys}"
        return
    assert not wrong, f"accepted {wrong}"


def hints_of(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def train_hints() -> dict[str, Any]:
    """The keys a training settings mapping takes: TrainConfig's fields (`env` a mapping) and the run-level env
    settings at the top level (RUN_ENV_KEYS, declared once, in EnvConfig)."""
    env = hints_of(EnvConfig)
    return {**hints_of(TrainConfig), "env": Mapping, **{k: env[k] for k in RUN_ENV_KEYS}}


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(mappings(EnvConfig))
def test_env_config_rejects_bad_mappings_with_a_value_error_naming_the_key(mapping):
    assert_clean(EnvConfig.from_mapping, mapping, hints_of(EnvConfig))


@FUZZ
@given(mappings(TrainConfig, list(RUN_ENV_KEYS)))
def test_train_config_rejects_bad_mappings_with_a_value_error_naming_the_key(mapping):
    assert_clean(TrainConfig.from_mapping, mapping, train_hints())


@FUZZ
@given(st.dictionaries(st.sampled_from(field_names(EnvConfig)), ODD_VALUES, max_size=3))
def test_train_config_env_section_is_checked_the_same_way(env):
    assert_clean(lambda m: TrainConfig.from_mapping({"env": m}), env, hints_of(EnvConfig))


BASE = {"name": "f", "arms": {"a": {}, "b": {"controller": "none"}}, "seeds": [0, 1]}


@FUZZ
@given(mappings(ExperimentSpec))
def test_experiment_mappings_reject_bad_values_with_a_value_error_naming_the_key(mapping):
    assert_clean(lambda m: ExperimentSpec.from_mapping({**BASE, **m}), mapping, hints_of(ExperimentSpec))


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(["controller", "reward_mode", "lr", "envs", "env", "seed", "bogus"]), ODD_VALUES, max_size=3
    )
)
def test_arm_settings_are_checked_before_anything_runs(arm):
    assert_clean(
        lambda m: ExperimentSpec.from_mapping({**BASE, "arms": {"a": {}, "b": m}}),
        arm,
        {**train_hints(), "controller": str},
    )
