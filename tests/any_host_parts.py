"""Plug-in hosts of other slot counts for tests/test_any_host.py: the 3-block ToyMLP of tests/plugin_parts.py with
2, 4 (and wider) and 9 blocks, one slot after each block, registered on import."""

from __future__ import annotations

import esper_ray
from tests.plugin_parts import ToyMLP  # registers the toy task and the 3-slot toy-mlp too

esper_ray.register_host("any-mlp-2", ToyMLP, width=16, blocks=2)
esper_ray.register_host("any-mlp-4", ToyMLP, width=32, blocks=4)
esper_ray.register_host("any-mlp-17", ToyMLP, width=16, blocks=17)  # MAX_SLOTS + 1
