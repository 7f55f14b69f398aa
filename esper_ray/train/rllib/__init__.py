"""The RLlib glue: PPO config, learner, env runner, env factory, callbacks, connectors, overlapped PPO, rounds."""
