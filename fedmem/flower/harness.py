"""Drive fedmem's Flower wrappers round by round without a Flower simulation (audits, tests).

A Flower simulation costs seconds per round; a privacy audit needs thousands of rounds.
These helpers call the wrappers' own hooks (``configure_fit``/``aggregate_fit`` or
``configure_train``/``aggregate_train``) with in-process stand-ins for Flower's client
manager / grid, exactly as Flower's server loop does, so what is audited is the wrapper
code that runs in a deployment.

* :func:`legacy_round` / :func:`run_legacy_rounds`: a
  :class:`~fedmem.flower.gateway.SupportGatewayStrategy` (or any legacy strategy).
* :func:`message_round` / :func:`run_message_rounds`: a
  :class:`~fedmem.flower.message_api.GatewayStrategy` (or any Message-API strategy).
* :func:`make_wrapped` + :func:`run_wrapped_rounds`: N rounds of a wrapper (``dp="fedmem"`` or
  ``"flower"``, either API) with unlimited budgets, for privacy audits.
* :class:`Spy`: records what a wrapped strategy's aggregation receives (the inner
  strategy's view, an observer in the audits).

Each round's replies are a list (one per client, in sampling order) of lists of arrays;
``None`` for a client makes it fail (legacy: a failure; Message API: an error reply).
Replies are assigned to sampled nodes in the order the wrapped strategy sampled them.
"""

from __future__ import annotations

import numpy as np

from fedmem.dp import Accountant
from fedmem.flower.gateway import SupportGatewayStrategy

__all__ = ["FakeClientManager", "FakeGrid", "Spy", "legacy_round", "make_wrapped", "message_round", "run_legacy_rounds",
           "run_message_rounds", "run_wrapped_rounds"]


# ----------------------------------------------------------------------------- legacy API
class _Proxy:
    def __init__(self, node_id: int):
        self.node_id = node_id
        self.cid = str(node_id)


class FakeClientManager:
    """A client manager of ``n`` always-available clients; ``sample`` returns the first ``num_clients``
    (deterministic: the audits need the same node order every round)."""

    def __init__(self, n: int):
        self.proxies = [_Proxy(100 + i) for i in range(int(n))]

    def num_available(self) -> int:
        return len(self.proxies)

    def all(self) -> dict:
        return {p.cid: p for p in self.proxies}

    def wait_for(self, num_clients: int, timeout: int = 86400) -> bool:
        return len(self.proxies) >= num_clients

    def sample(self, num_clients: int, min_num_clients: int | None = None, criterion=None):
        return self.proxies[:num_clients]


def legacy_round(strategy, server_round: int, replies, *, num_examples=5, metrics=None, parameters=None,
                 client_manager=None):
    """One fit round of a legacy strategy. Returns ``(output ndarrays or None, instructions)``."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

    cm = client_manager or FakeClientManager(len(replies))
    params = parameters if parameters is not None else strategy.initialize_parameters(cm)
    if params is None:
        params = ndarrays_to_parameters([np.zeros(1)])
    ins = strategy.configure_fit(server_round, params, cm)
    if not ins:
        return None, ins
    results, failures = [], []
    for i, ((proxy, _), arrays) in enumerate(zip(ins, replies)):
        if arrays is None:
            failures.append(RuntimeError("client failed"))
            continue
        ne = num_examples[i] if isinstance(num_examples, (list, tuple)) else num_examples
        results.append((proxy, FitRes(Status(Code.OK, ""), ndarrays_to_parameters([np.asarray(a) for a in arrays]),
                                      int(ne), dict(metrics or {}))))
    out, _ = strategy.aggregate_fit(server_round, results, failures)
    return (None if out is None else parameters_to_ndarrays(out)), ins


def run_legacy_rounds(strategy, rounds, **kw) -> list:
    """Outputs (list of ndarrays, or None when nothing was released) of consecutive rounds 1..len(rounds)."""
    return [legacy_round(strategy, r + 1, replies, **kw)[0] for r, replies in enumerate(rounds)]


# ----------------------------------------------------------------------------- Message API
def _identity() -> None:
    """Flower's Message constructor reads the process's task identity (set by Flower's runtime in a real
    run); outside one, set a neutral identity once (run 0, node 0, task 0)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_node_id", "_task_id"):
        if getattr(TaskIdentity, name) is None:
            setattr(TaskIdentity, name, 0)


class FakeGrid:
    """A grid of ``n`` connected nodes (ids 100..); only ``get_node_ids`` is used by strategies' sampling."""

    def __init__(self, n: int):
        self.nodes = [100 + i for i in range(int(n))]

    def get_node_ids(self):
        return list(self.nodes)


def message_round(strategy, server_round: int, replies, *, num_examples=5, metrics=None, arrays=None,
                  grid=None, weight_key: str = "num-examples"):
    """One train round of a Message-API strategy. Returns ``(output list of ndarrays or None, messages)``."""
    from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

    _identity()
    g = grid or FakeGrid(len(replies))
    if arrays is None:
        arrays = ArrayRecord([np.zeros_like(np.asarray(a, dtype=np.float64)) for a in next(
            r for r in replies if r is not None)])
    msgs = list(strategy.configure_train(server_round, arrays, ConfigRecord(), g))
    out_msgs = []
    for i, (m, rep) in enumerate(zip(msgs, replies)):
        if rep is None:
            out_msgs.append(Message(Error(code=1, reason="client failed"), reply_to=m))
            continue
        ne = num_examples[i] if isinstance(num_examples, (list, tuple)) else num_examples
        met = {weight_key: ne} if ne is not None else {}
        met.update(metrics or {})
        content = RecordDict({"arrays": ArrayRecord([np.asarray(a, dtype=np.float64) for a in rep]),
                              "metrics": MetricRecord(met)})
        out_msgs.append(Message(content, reply_to=m))
    out, _ = strategy.aggregate_train(server_round, out_msgs)
    return (None if out is None else out.to_numpy_ndarrays()), msgs


def run_message_rounds(strategy, rounds, **kw) -> list:
    return [message_round(strategy, r + 1, replies, **kw)[0] for r, replies in enumerate(rounds)]


# ----------------------------------------------------------------------------- observer
class Spy:
    """Wrap a strategy object's aggregation (legacy ``aggregate_fit`` or Message ``aggregate_train``) to
    record what it receives: ``views[round]`` = list of replies' array lists (the inner strategy's view).
    Returns the same object (its class is unchanged, so type checks still see the real strategy)."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.views: dict[int, list] = {}
        if hasattr(strategy, "aggregate_fit"):
            orig = strategy.aggregate_fit

            def aggregate_fit(server_round, results, failures):
                from flwr.common import parameters_to_ndarrays

                self.views[server_round] = [parameters_to_ndarrays(r.parameters) for _, r in results]
                return orig(server_round, results, failures)

            strategy.aggregate_fit = aggregate_fit
        if hasattr(strategy, "aggregate_train"):
            orig_t = strategy.aggregate_train

            def aggregate_train(server_round, replies):
                replies = list(replies)
                self.views[server_round] = [next(iter(m.content.array_records.values())).to_numpy_ndarrays()
                                            for m in replies if not m.has_error()]
                return orig_t(server_round, replies)

            strategy.aggregate_train = aggregate_train


# ----------------------------------------------------------------------------- audits: N wrapped rounds
def make_wrapped(dp: str = "fedmem", *, api: str = "legacy", num_sampled_clients: int, noise_multiplier: float,
                 sensitivity: float, public_num_examples: int = 5, seed: int = 0, inner=None,
                 flower_clipping_norm: float | None = None, delta: float = 1e-6):
    """A gateway wrapper with unlimited budgets, for audits.

    ``dp="fedmem"``: the gateway's own release (secure sampler) around ``inner`` (default
    FedAvg of the chosen ``api``). ``dp="flower"`` (legacy only): Flower's
    ``DifferentialPrivacyClientSideFixedClipping(FedAvg, noise_multiplier,
    flower_clipping_norm)`` inside the gateway; its noise is numpy's float sampler on the
    GLOBAL numpy RNG (seed it yourself with ``np.random.seed`` for a reproducible audit).
    The wrapper's ``epsilon_per_round`` is what one round books.
    """
    import math

    m = int(num_sampled_clients)
    if api not in ("legacy", "message"):
        raise ValueError(f"api must be 'legacy' or 'message'. Found {api!r}.")
    if dp not in ("fedmem", "flower"):
        raise ValueError(f"dp must be 'fedmem' or 'flower'. Found {dp!r}.")
    common = dict(public_num_examples=public_num_examples, epsilon_budget=math.inf, total_epsilon_budget=math.inf,
                  delta=delta)
    if api == "message":
        if dp != "fedmem":
            raise ValueError("dp must be 'fedmem' with api='message' (Flower's Message-API DP wrappers are not "
                             "wrapped by fedmem). Found 'flower'.")
        from flwr.serverapp.strategy import FedAvg

        from fedmem.flower.message_api import GatewayStrategy  # lazy: ~5 ms, no heavy package

        return GatewayStrategy(inner or FedAvg(min_train_nodes=m, min_available_nodes=m), noise_multiplier,
                               sensitivity, m, rng=np.random.default_rng(seed), **common)
    from flwr.server.strategy import DifferentialPrivacyClientSideFixedClipping, FedAvg

    if dp == "flower":
        if flower_clipping_norm is None:
            raise ValueError("flower_clipping_norm must be given with dp='flower'. Found None.")
        wrapped = DifferentialPrivacyClientSideFixedClipping(
            inner or FedAvg(min_fit_clients=m, min_available_clients=m), noise_multiplier=noise_multiplier,
            clipping_norm=flower_clipping_norm, num_sampled_clients=m)
        return SupportGatewayStrategy(wrapped, Accountant("rdp"), num_sampled_clients=m, dp="flower",
                                      sensitivity=sensitivity, **common)
    return SupportGatewayStrategy(inner or FedAvg(min_fit_clients=m, min_available_clients=m), Accountant("rdp"),
                                  num_sampled_clients=m, dp="fedmem", noise_multiplier=noise_multiplier,
                                  sensitivity=sensitivity, rng=np.random.default_rng(seed), **common)


def run_wrapped_rounds(strategy, rounds, *, first_round: int = 1, **kw) -> list:
    """Run ``rounds`` (each: one reply per client, a list of arrays) through a wrapper from
    :func:`make_wrapped` (either API); returns each round's released arrays (None: nothing released)."""
    run = message_round if hasattr(strategy, "aggregate_train") else legacy_round
    return [run(strategy, first_round + i, replies, **kw)[0] for i, replies in enumerate(rounds)]
