"""fedmem inside Flower (flwr 1.42): gateway strategy wrappers and a SecAgg+ shard federation.

* :class:`GatewayStrategy` (:mod:`fedmem.flower.message_api`): wrap a Message-API
  ``flwr.serverapp.strategy.Strategy`` (FedAvg, FedMedian, FedAdam, yours): only a booked,
  securely noised mean leaves a round, and the wrapped strategy is post-processing of it.
* :class:`SupportGatewayStrategy` (:mod:`fedmem.flower.gateway`): the same for the legacy
  ``flwr.server.strategy.Strategy`` API (and ``SecAggPlusWorkflow``). Both share
  :class:`fedmem.flower.core.GatewayCore` (docs/flower.md).
* :func:`fedmem.flower.mods.fixedclipping_mod`: the client side of the contract (clip each
  train reply to a fixed L2 norm), for the wrappers' ``clipping="client"``.
* :class:`SecAggGrid` (:mod:`fedmem.flower.fixedpoint`): values on Flower's SecAgg+
  quantization grid, so a SecAgg+ sum decodes bit for bit.
* :mod:`fedmem.flower.harness`: drive the wrappers round by round without a simulation.
* :mod:`fedmem.flower.apps`, :mod:`fedmem.flower.sim`, :mod:`fedmem.experiments.flower`:
  shards as ClientApps, one query per round, the ``flower.support_leak`` scenario kind.

Importing this package is light: it pulls Flower, numpy and fedmem's DP code, never torch,
CrypTen or Ray (``tests/test_flower_api.py`` checks ``sys.modules``). The Message-API
wrapper is imported lazily on first use of :class:`GatewayStrategy`.
"""

from fedmem.flower.core import GatewayCore, RoundRecord
from fedmem.flower.fixedpoint import SecAggGrid
from fedmem.flower.gateway import SupportGatewayStrategy, find_flower_dp

__all__ = ["GatewayCore", "GatewayStrategy", "RoundRecord", "SecAggGrid", "SupportGatewayStrategy", "find_flower_dp"]


def __getattr__(name: str):
    if name == "GatewayStrategy":
        from fedmem.flower.message_api import GatewayStrategy  # lazy: ~13 ms, no heavy package

        return GatewayStrategy
    raise AttributeError(f"module 'fedmem.flower' has no attribute {name!r}")
