"""Add fedmem's support gateway to an existing Flower 1.42 ServerApp (SecAgg+ + central DP).

Legacy API example: Flower 1.42 offers SecAgg+ only through the legacy ``SecAggPlusWorkflow``
(legacy ``Strategy``), and this script uses Flower's deprecated ``run_simulation``. For the
Message API and ``flwr run`` see ``examples/flower-app/`` (the primary way).

The Flower part is stock: a NumPyClient, ``secaggplus_mod``, ``FedAvg``,
``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))``. The fedmem part is the block
marked ``# --- fedmem`` in ``server_main``: wrap the strategy, give it an accountant, and
declare the client contract (every client replies with the same ``num_examples``).

Run:  python examples/flower_gateway_app.py [--clients 4] [--rounds 3] [--ledger ledger.sqlite] [--client-cpus 0.5]
It prints one line per round (admitted / refused / fault) and the booked epsilon.
"""

from __future__ import annotations

import argparse
import math
import os

import numpy as np

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")

from flwr.client import ClientApp, NumPyClient  # noqa: E402
from flwr.client.mod import secaggplus_mod  # noqa: E402
from flwr.common import ndarrays_to_parameters  # noqa: E402
from flwr.server import LegacyContext, ServerApp, ServerConfig  # noqa: E402
from flwr.server.strategy import FedAvg  # noqa: E402
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

from fedmem.dp import Accountant, DurableStore  # noqa: E402
from fedmem.flower import SupportGatewayStrategy  # noqa: E402

DIM, CLIP, WEIGHT = 8, 1.0, 10       # vector size, per-client L2 clip, the public num_examples


class Client(NumPyClient):
    """A client whose private vector is clipped to norm CLIP; always replies with num_examples=WEIGHT."""

    def __init__(self, pid: int):
        self.x = np.random.default_rng(pid).standard_normal(DIM)
        self.x *= min(1.0, CLIP / np.linalg.norm(self.x))

    def fit(self, parameters, config):
        return [self.x], WEIGHT, {}           # fedmem contract: constant num_examples, no metrics


client_app = ClientApp(client_fn=lambda ctx: Client(int(ctx.node_config["partition-id"])).to_client(),
                       mods=[secaggplus_mod])


def make_server_app(num_clients: int, rounds: int, ledger: str | None, seed: int = 0):
    out = {}
    server_app = ServerApp()

    @server_app.main()
    def server_main(grid, context):
        strategy = FedAvg(fraction_fit=1.0, min_fit_clients=num_clients, min_available_clients=num_clients,
                          fraction_evaluate=0.0, initial_parameters=ndarrays_to_parameters([np.zeros(DIM)]))
        # --- fedmem: book the aggregate, refuse what cannot be booked, fail closed on faults
        accountant = Accountant("rdp", store=DurableStore(ledger), name="flower-app")
        strategy = SupportGatewayStrategy(
            strategy, accountant, num_sampled_clients=num_clients,
            dp="fedmem", noise_multiplier=1.0, sensitivity=CLIP,      # one client's vector moves the sum by <= CLIP
            public_num_examples=WEIGHT, epsilon_budget=math.inf, total_epsilon_budget=math.inf,
            rng=np.random.default_rng(seed))
        # --- end fedmem
        ctx = LegacyContext(context=context, config=ServerConfig(num_rounds=rounds), strategy=strategy)
        DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(num_shares=num_clients, reconstruction_threshold=2,
                                                        max_weight=WEIGHT))(grid, ctx)
        out["audit"] = [(r.server_round, r.decision, r.reasons) for r in strategy.audit]
        out["epsilon"] = strategy.gateway.principal_spent(strategy.principal)

    return server_app, out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ledger", default=None, help="SQLite file of the accountant (default: in memory)")
    ap.add_argument("--client-cpus", type=float, default=0.5,
                    help="CPUs per simulated client (Flower's client_resources): Flower's Ray backend starts "
                         "2 / this many ClientApp actors on its 2 CPUs (default 0.5: 4 actors)")
    args = ap.parse_args(argv)
    server_app, out = make_server_app(args.clients, args.rounds, args.ledger)
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=args.clients,
                   backend_config={"init_args": {"num_cpus": 2, "include_dashboard": False, "address": "local"},
                                   "client_resources": {"num_cpus": args.client_cpus, "num_gpus": 0.0}})
    for rnd, decision, reasons in out["audit"]:
        print(f"round {rnd}: {decision} {' '.join(reasons)}".rstrip())
    print(f"epsilon booked: {out['epsilon']:.4f}")
    return out


if __name__ == "__main__":
    main()
