"""The bodies of `esper-ray train`, `eval`, `heuristic` and `grow`, the episodes they run and the networks they keep."""
