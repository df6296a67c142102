"""fedmem: federated agent memory under differential privacy, and attacks on it."""

__version__ = "0.1.0"

from fedmem import _lazy_dpa

_lazy_dpa.install()   # dp_accounting.pld / mechanism_calibration load only where used (start-up time)
