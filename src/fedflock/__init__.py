"""fedflock: clustered federated learning, in simulation and on Flower."""

__version__ = "0.1.0"
