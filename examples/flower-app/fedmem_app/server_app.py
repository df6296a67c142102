"""ServerApp: Flower's Message-API FedAvg behind fedmem's gateway (swap in any Message-API strategy).

With ``secagg = true`` (default) the shards' replies are summed with SecAgg+: Flower 1.42 has
SecAgg+ only as the legacy ``SecAggPlusWorkflow``, so the Message-API strategy runs under it through
``fedmem.flower.bridge.LegacyBridge``; ``secagg = false`` runs ``strategy.start`` (plain Message API).

The gateway (``fedmem.flower.GatewayStrategy``) admits a round only if its epsilon fits the
budgets, computes the noised sum of the shards' replies itself (exact discrete Gaussian on a
public grid), and hands FedAvg only that noised mean: FedAvg (or FedMedian, FedAdam, yours) is
post-processing. Every admitted round is booked in fedmem's ledger and in Flower's
``RdpAccountant``; the last lines print the privacy spent.
"""

from __future__ import annotations

import time

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.server import LegacyContext, ServerConfig
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log
from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig, SamplingMethod
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

from fedmem.flower import GatewayStrategy
from fedmem.flower.bridge import LegacyBridge

from .task import sensitivity

app = ServerApp()


def _nodes(grid: Grid, timeout_s: float = 60.0) -> int:
    """The number of shards (public): every connected node is one shard and answers every round."""
    deadline = time.monotonic() + timeout_s
    while not (ids := list(grid.get_node_ids())) and time.monotonic() < deadline:
        time.sleep(0.5)
    return len(ids)


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    m = _nodes(grid)
    delta = float(cfg["delta"])
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=m, min_available_nodes=m)
    flower_acc = RdpAccountant(PrivacyConfig(target_delta=delta, population_size=m,
                                             neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                             sampling_method=SamplingMethod.NO_AMPLIFICATION,
                                             max_epsilon=float(cfg["epsilon-budget"])))
    # --- fedmem: the gateway around the Message-API strategy
    gateway = GatewayStrategy(strategy, float(cfg["noise-multiplier"]), sensitivity(cfg), m,
                              public_num_examples=int(cfg["k-local"]), rng=np.random.default_rng(int(cfg["seed"])),
                              accountant=flower_acc, epsilon_budget=float(cfg["epsilon-budget"]),
                              total_epsilon_budget=float(cfg["total-epsilon-budget"]), delta=delta)
    # --- end fedmem
    initial = ArrayRecord([np.zeros(int(cfg["value-dim"]) + 1)])
    rounds = int(cfg["num-server-rounds"])
    if bool(cfg["secagg"]):
        # Flower 1.42 has SecAgg+ only as the legacy SecAggPlusWorkflow: run the Message-API strategy under it.
        bridge = LegacyBridge(gateway, initial)
        k = int(cfg["k-local"])
        workflow = SecAggPlusWorkflow(num_shares=m, reconstruction_threshold=max(2, m // 2 + 1),
                                      clipping_range=float(cfg["secagg-clipping-range"]),
                                      quantization_range=2 ** 22, modulus_range=2 ** 32, max_weight=float(k))
        DefaultWorkflow(fit_workflow=workflow)(grid, LegacyContext(context=context, config=ServerConfig(
            num_rounds=rounds), strategy=bridge))
        released = bridge.arrays
    else:
        released = gateway.start(grid=grid, initial_arrays=initial, num_rounds=rounds,
                                 train_config=ConfigRecord({})).arrays
    spent = gateway.privacy_spent()
    for rec in gateway.audit:
        line = f"round {rec.server_round}: {rec.decision} {' '.join(rec.reasons)}".rstrip()
        log(20, "fedmem: %s", line)
        print(line, flush=True)
    if released is not None:
        last = np.concatenate([a.ravel() for a in released.to_numpy_ndarrays()])
        print(f"last release: noised matches {last[-1] * m:.2f} over {m} shards", flush=True)
    msg = (f"privacy spent: epsilon={spent.epsilon:.4f} at delta={spent.delta:g} over {spent.num_releases} rounds "
           f"(Flower accountant: epsilon={flower_acc.get_privacy_spent().epsilon:.4f})")
    log(20, "fedmem: %s", msg)
    print(msg, flush=True)
