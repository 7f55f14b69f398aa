"""Processes, threads and the Ray cluster: joining Ray, fitting a run, MPS, GPU spread, SIGTERM, reaping, threads."""
