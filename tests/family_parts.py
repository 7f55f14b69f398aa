"""A family of cheap digits-impaired members with short runs, registered on import, as a run's `plugins:
[tests.family_parts]` imports it in every process (tests/test_families.py)."""

from esper_ray.contracts.families import Member, register_family

register_family(
    "test-family",
    (
        Member("plain", {"max_epochs": 3}),
        Member("wide", {"host_preset": "digits-impaired-wide", "max_epochs": 4}),
        Member("few", {"train_samples": 200, "max_epochs": 3}),
    ),
)
