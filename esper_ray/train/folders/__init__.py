"""A run folder on disk: its checkpoints, their manifests, and the lock that keeps one writer."""
