"""Run a Message-API strategy under Flower's legacy workflows, for SecAgg+.

Flower 1.42 implements SecAgg+ only as ``SecAggPlusWorkflow``, which drives a legacy
``flwr.server.strategy.Strategy`` through a ``LegacyContext``. :class:`LegacyBridge` is such a
legacy strategy around a Message-API strategy (typically
:class:`fedmem.flower.message_api.GatewayStrategy` around ``flwr.serverapp.strategy.FedAvg``):

* ``configure_fit`` calls the Message-API ``configure_train`` with a grid of the client
  manager's nodes and turns its messages into ``FitIns`` (the message's arrays and config) for
  the same nodes;
* ``aggregate_fit`` turns each ``FitRes`` into a reply ``Message`` to that node's instruction
  (arrays, and ``{weighted_by_key: num_examples, **metrics}``) and failures into error
  replies, and calls ``aggregate_train``. Under SecAgg+ every result carries the unmasked
  aggregate (the mean), so the gateway's sum of the replies is ``m`` times that mean.

Exceptions of the Message-API strategy (``PrivacyBudgetExhausted``, ``ValueError``) propagate
and stop the run, as they do under ``Strategy.start``.
"""

from __future__ import annotations

from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.strategy import Strategy as LegacyStrategy

__all__ = ["LegacyBridge"]


class _NodesGrid:
    """The part of a ``Grid`` a strategy's sampling reads: the connected node ids."""

    def __init__(self, node_ids):
        self._ids = list(node_ids)

    def get_node_ids(self):
        return list(self._ids)


class LegacyBridge(LegacyStrategy):
    """A legacy strategy that delegates every fit round to a Message-API ``strategy`` (module doc)."""

    def __init__(self, strategy, initial_arrays: ArrayRecord):
        super().__init__()
        self.strategy = strategy
        self.initial_arrays = initial_arrays
        inner = getattr(strategy, "strategy", strategy)
        self.weight_key = str(getattr(strategy, "weight_key", getattr(inner, "weighted_by_key", "num-examples")))
        self._msgs: dict[int, dict] = {}
        self.arrays: ArrayRecord | None = None     # the last released arrays

    def __repr__(self) -> str:
        return f"LegacyBridge({self.strategy!r})"

    def initialize_parameters(self, client_manager):
        return ndarrays_to_parameters(self.initial_arrays.to_numpy_ndarrays())

    def configure_fit(self, server_round, parameters, client_manager):
        proxies = {p.node_id: p for p in client_manager.all().values()}
        arrays = ArrayRecord([a for a in parameters_to_ndarrays(parameters)])
        msgs = list(self.strategy.configure_train(server_round, arrays, ConfigRecord(), _NodesGrid(proxies)))
        self._msgs[server_round] = {m.metadata.dst_node_id: m for m in msgs}
        out = []
        for m in msgs:
            cfg = {}
            for rec in m.content.config_records.values():
                cfg.update(dict(rec))
            out.append((proxies[m.metadata.dst_node_id], FitIns(parameters, cfg)))
        return out

    def aggregate_fit(self, server_round, results, failures):
        msgs = self._msgs.pop(server_round, {})
        replies, answered = [], set()
        for proxy, res in results:
            ins = msgs.get(proxy.node_id)
            if ins is None:
                continue
            answered.add(proxy.node_id)
            content = RecordDict({
                "arrays": ArrayRecord({str(i): Array(a) for i, a in enumerate(parameters_to_ndarrays(res.parameters))}),
                "metrics": MetricRecord({self.weight_key: int(res.num_examples), **dict(res.metrics or {})})})
            replies.append(Message(content, reply_to=ins))
        missing = [m for nid, m in msgs.items() if nid not in answered]
        for _, ins in zip(failures, missing):
            replies.append(Message(Error(code=0, reason="client failure"), reply_to=ins))
        arrays, _ = self.strategy.aggregate_train(server_round, replies)
        if arrays is None:
            return None, {}
        self.arrays = arrays
        return ndarrays_to_parameters(arrays.to_numpy_ndarrays()), {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None
