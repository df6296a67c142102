"""fedmem: federated agent memory under differential privacy, and attacks on it."""

__version__ = "0.1.0"
