"""ServerApp: Flower's Message-API FedAvg behind fedmem's gateway (swap in any Message-API strategy).

With ``secagg = true`` (default) the shards' replies are summed with SecAgg+: Flower 1.42 has
SecAgg+ only as the legacy ``SecAggPlusWorkflow``, so the Message-API strategy runs under it through
``fedmem.flower.bridge.LegacyBridge``; ``secagg = false`` runs ``strategy.start`` (plain Message API).

The gateway (``fedmem.flower.GatewayStrategy``) admits a round only if its epsilon fits the
budgets, computes the noised sum of the shards' replies itself (exact discrete Gaussian on a
public grid), and hands FedAvg only that noised mean: FedAvg (or FedMedian, FedAdam, yours) is
post-processing. Every admitted round is booked in fedmem's ledger and in Flower's
``RdpAccountant``; the last lines print the privacy spent.

Flower's defaults: ``flwr run`` simulates 2 SuperNodes, and SecAgg+ needs at least 3 (its
``num_shares`` must be > 2). With fewer, this ServerApp says so in one WARNING line and runs
without SecAgg+ (the plain Message-API loop: the server process then sees each reply before
the gateway's noise, as it sees the unmasked sum with SecAgg+); the release, the booking and
the privacy spent are the same. Other problems end the run with one ``fedmem: error: ...``
line and a failed run (Flower records exit code 700; note that Flower 1.42's ``flwr run``
itself returns 0 whatever the run's outcome): ``num-server-rounds`` beyond what the budgets
allow (checked before any round), or ``max-refused-rounds`` rounds refused (for example a
ClientApp that replies its real dataset size as ``num-examples``: the line says what was
expected and what came back).

The noise RNG is seeded from OS entropy unless ``noise-seed`` (>= 0) asks for a reproducible
run (a WARNING says so: the seed is in the public run config, so the noise would be known).
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
from fedmem.flower.core import epsilon_of

from .task import reply_bound, sensitivity

app = ServerApp()
SECAGG_MIN_NODES = 3     # SecAggPlusWorkflow: num_shares > 2


class AppError(RuntimeError):
    """A run that cannot go on: its text is one readable line."""


def _fail(line: str) -> None:
    line = f"fedmem: error: {line}"
    log(40, "%s", line)
    print(line, flush=True)
    raise AppError(line) from None


class _StopAfterRefusals(GatewayStrategy):
    """The gateway, ending the run after ``max_refused`` refused rounds (one readable line)."""

    def __init__(self, *args, max_refused: int, **kw):
        super().__init__(*args, **kw)
        self.max_refused = max_refused

    def aggregate_train(self, server_round, replies):
        out = super().aggregate_train(server_round, replies)
        refused = [r for r in self.audit if r.decision != "admitted"]
        if out[0] is None and refused and refused[-1].server_round == server_round:
            rec = refused[-1]
            why = ",".join(rec.reasons)
            if "num_examples" in rec.reasons:
                why = (f"num_examples: every reply must carry num-examples = {self.core.public_num_examples} "
                       f"(run config k-local, the public constant of the contract); the replies carried "
                       f"{rec.detail.get('num_examples')}")
            line = f"round {server_round} refused ({why}): nothing released, nothing booked"
            log(30, "fedmem: %s", line)
            print(line, flush=True)
            if len(refused) >= self.max_refused:
                _fail(f"{len(refused)} round(s) refused (max-refused-rounds = {self.max_refused}); last: {why}")
        return out


def _rounds_that_fit(multiplier: float, delta: float, budget: float, want: int) -> int:
    n = 0
    while n < want and epsilon_of(multiplier, delta, rounds=n + 1) <= budget:
        n += 1
    return n


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
    if m < 1:
        _fail("no SuperNode connected within 60 s")
    delta = float(cfg["delta"])
    sigma, rounds = float(cfg["noise-multiplier"]), int(cfg["num-server-rounds"])
    budget = min(float(cfg["epsilon-budget"]), float(cfg["total-epsilon-budget"]))
    fit = _rounds_that_fit(sigma, delta, budget, rounds)
    if fit < rounds:
        _fail(f"num-server-rounds = {rounds} does not fit the budget: epsilon-budget = {cfg['epsilon-budget']} / "
              f"total-epsilon-budget = {cfg['total-epsilon-budget']} at delta = {delta:g} allow {fit} round(s) at "
              f"noise-multiplier = {sigma:g}; lower num-server-rounds or raise a budget or noise-multiplier")
    seed = int(cfg.get("noise-seed", -1))
    if seed >= 0:
        log(30, "fedmem: noise RNG seeded from noise-seed = %d (reproducible; the seed is public run config, so "
            "anyone who reads it knows the noise: for tests only)", seed)
        rng = np.random.default_rng(seed)
    else:
        rng = np.random.default_rng()           # OS entropy
    secagg = bool(cfg["secagg"])
    if secagg and m < SECAGG_MIN_NODES:
        line = (f"fedmem: warning: SecAgg+ needs >= {SECAGG_MIN_NODES} SuperNodes, found {m}: running WITHOUT SecAgg+ "
                f"(the server process sees each reply before the gateway's noise). For SecAgg+: flwr run . --stream "
                f"--federation-config \"num-supernodes={SECAGG_MIN_NODES}\"")
        log(30, "%s", line)
        print(line, flush=True)
        secagg = False
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=m, min_available_nodes=m)
    flower_acc = RdpAccountant(PrivacyConfig(target_delta=delta, population_size=m,
                                             neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                             sampling_method=SamplingMethod.NO_AMPLIFICATION,
                                             max_epsilon=float(cfg["epsilon-budget"])))
    # --- fedmem: the gateway around the Message-API strategy
    # record-level adjacency: one record moves one reply by <= sensitivity; the server enforces each reply's
    # public bound (clip_norm), as the ClientApp's clipping mod does
    gateway = _StopAfterRefusals(strategy, sigma, sensitivity(cfg), m, public_num_examples=int(cfg["k-local"]),
                                 rng=rng, accountant=flower_acc, epsilon_budget=float(cfg["epsilon-budget"]),
                                 total_epsilon_budget=float(cfg["total-epsilon-budget"]), delta=delta,
                                 clip_norm=reply_bound(cfg), max_refused=int(cfg["max-refused-rounds"]))
    # --- end fedmem
    initial = ArrayRecord([np.zeros(int(cfg["value-dim"]) + 1)])
    if secagg:
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
