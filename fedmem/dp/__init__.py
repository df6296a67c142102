"""DP core: mechanisms (frozen records + samplers), accountant, ledger, durable store."""

from fedmem.dp.accountant import Accountant, Booking, book_together
from fedmem.dp.ledger import AttributeLedger
from fedmem.dp.mechanisms import (
    ApproxDpEvent,
    ExponentialMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    MetricLaplace,
    PureDpEvent,
)
from fedmem.dp.store import DurableStore

__all__ = [
    "Accountant", "ApproxDpEvent", "Booking", "AttributeLedger", "DurableStore", "ExponentialMechanism",
    "GaussianMechanism", "LaplaceMechanism", "MetricLaplace", "PureDpEvent", "book_together",
]
