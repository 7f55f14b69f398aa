"""esper-ray: morphogenetic neural networks whose growth is controlled by a PPO policy, on Ray."""

__version__ = "0.1.0"
