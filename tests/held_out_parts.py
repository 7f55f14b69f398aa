"""Two cheap held-out hosts of the digits task, the `held_out:` list of the transfer and equal-cost tests'
experiment files (tests/test_transfer.py, tests/test_equal_cost.py)."""

HOSTS = [{"name": "digits", "env": {"task": "digits"}}, {"name": "wide", "env": {"task": "digits", "max_epochs": 4}}]
