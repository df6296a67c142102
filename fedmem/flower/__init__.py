"""fedmem inside Flower (flwr 1.42): a support gateway strategy wrapper and a SecAgg+ shard federation.

* :class:`SupportGatewayStrategy` (:mod:`fedmem.flower.gateway`): wrap any Flower strategy
  so that only booked DP or public channels leave a fit round (docs/flower.md).
* :class:`SecAggGrid` (:mod:`fedmem.flower.fixedpoint`): values on Flower's SecAgg+
  quantization grid, so a SecAgg+ sum decodes bit for bit.
* :mod:`fedmem.flower.apps`, :mod:`fedmem.flower.sim`, :mod:`fedmem.experiments.flower`:
  shards as ClientApps, one query per round, the ``flower.support_leak`` scenario kind.
"""

from fedmem.flower.fixedpoint import SecAggGrid
from fedmem.flower.gateway import RoundRecord, SupportGatewayStrategy, find_flower_dp

__all__ = ["RoundRecord", "SecAggGrid", "SupportGatewayStrategy", "find_flower_dp"]
