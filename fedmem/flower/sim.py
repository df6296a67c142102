"""Run one deployment as a Flower simulation (``run_simulation``, Ray backend) in a fresh process.

Flower 1.42's Ray backend calls ``ray.init`` itself when Ray is not initialised and
**always** ``ray.shutdown()`` when the simulation ends (``RayBackend.terminate``). Inside
a process that already uses Ray (a test session, a ``fedmem run`` of another kind) that
would tear the caller's Ray down, so every simulation runs in a spawned child process,
where Flower starts a private local Ray (``fedmem._ray.local_options``: ``address="local"``,
the given CPUs, no dashboard; the same lean head as fedmem's own private instance,
``fedmem._ray.lean_private_head``) exactly as it normally does, and stops it.

:func:`simulate` takes a plain dict (picklable) and returns plain data: the
:class:`~fedmem.flower.apps.Recorder` records, the gateway's audit, the decoded SecAgg+
sums, and the accountant's spend (the ledger is a durable SQLite file the parent can
reopen). Deployments (``spec["deployment"]``):

* ``"stock"``: Flower + SecAgg+ + Flower's ``DifferentialPrivacyClientSideFixedClipping``
  (``fixedclipping_mod`` on clients), stock client contract (``num_examples`` = local
  count, ``metrics = {"matches": count}``). No accountant (Flower has none).
* ``"gateway"``: the same plus :class:`~fedmem.flower.gateway.SupportGatewayStrategy`
  outside it and the fedmem client contract; ``spec["dp"]`` selects Flower's DP wrapper
  (``"flower"``) or fedmem's noise (``"fedmem"``).
* ``"plain"``: SecAgg+ only, fedmem contract, no DP and no gateway (for the bit-exact test).

Faults (``spec``): ``drops`` ({partition id: [rounds]}) clients raise in ``fit`` (the
masked-vector stage of SecAgg+: an error reply, which Flower reports as a failure);
``stalls`` ({partition id: [rounds]}) clients reply ``stall_s`` seconds late, after the
round's deadline (``round_timeouts`` {round: seconds}, else ``timeout_s``): a silent
dropout, the server just gets fewer replies. The deadline is public configuration set on
``SecAggPlusWorkflow.timeout`` per round (:class:`_RoundDeadlines`); after a round with a
stalled client the server waits ``stall_s`` before the next round, so the late reply is
done before that node is asked again (simulation artefact, see :class:`_RoundDeadlines`; not
after the last round, which has no next one).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
import traceback

import numpy as np

from fedmem.dp import Accountant, DurableStore
from fedmem.dp.events import gaussian_mu
from fedmem.flower.fixedpoint import SecAggGrid
from fedmem.flower.gateway import SupportGatewayStrategy

DEPLOYMENTS = ("stock", "gateway", "plain")


def _check(spec: dict) -> None:
    if spec.get("deployment") not in DEPLOYMENTS:
        raise ValueError(f"deployment must be one of {DEPLOYMENTS}. Found {spec.get('deployment')!r}.")
    if spec.get("deployment") == "gateway" and spec.get("dp") not in ("flower", "fedmem"):
        raise ValueError(f"dp must be 'flower' or 'fedmem' for the gateway deployment. Found {spec.get('dp')!r}.")


class _RoundDeadlines:
    """A fit workflow: ``SecAggPlusWorkflow`` with a per-round deadline (its ``timeout`` attribute)."""

    def __init__(self, workflow, default, per_round: dict, pause_after: dict | None = None):
        self.workflow, self.default = workflow, default
        self.per_round = {int(k): float(v) for k, v in (per_round or {}).items()}
        self.pause_after = {int(k): float(v) for k, v in (pause_after or {}).items()}

    def __call__(self, grid, context) -> None:
        from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, Key

        rnd = int(context.state.config_records[MAIN_CONFIGS_RECORD][Key.CURRENT_ROUND])
        self.workflow.timeout = self.per_round.get(rnd, self.default)
        try:
            return self.workflow(grid, context)
        finally:
            # Let late (dropped-out) ClientApps finish before the next round: Flower's simulation writes a
            # node's context back when its message is done, and a late write-back would overwrite the
            # SecAgg+ state the next round set up for that node (it then fails that round: a fault of the
            # simulation, not of the protocol).
            if rnd in self.pause_after:
                time.sleep(self.pause_after[rnd])


class _Warnings(logging.Handler):
    """Collects the messages of Flower's WARNING-or-worse log records (e.g. the reply-count warning)."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record) -> None:
        try:
            self.messages.append(record.getMessage())
        except Exception:  # noqa: BLE001 - a broken record must not break the simulation
            self.messages.append(str(record.msg))


def _run(spec: dict) -> dict:
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    from flwr.app import Context
    from flwr.server import LegacyContext, ServerApp, ServerConfig
    from flwr.server.strategy import DifferentialPrivacyClientSideFixedClipping
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from flwr.simulation import run_simulation

    from fedmem._ray import lean_private_head, local_options  # lazy: ~1 ms, no heavy package
    from fedmem.flower.apps import QueryStrategy, Recorder, make_client_app  # lazy: ~14 ms, no heavy package

    logging.getLogger("flwr").setLevel(spec.get("flwr_log_level", logging.WARNING))
    dep = spec["deployment"]
    grid = SecAggGrid(spec["clipping_range"])
    m = spec["shards"]
    contract = "stock" if dep == "stock" else "fedmem"
    rounds = [{"query": np.asarray(r["query"]), "world": r.get("world", 0), "target": r.get("target", -1)}
              for r in spec["rounds"]]
    flower_dp = dep == "stock" or (dep == "gateway" and spec["dp"] == "flower")
    offset = 1 if flower_dp else 0
    query = QueryStrategy(rounds, num_clients=m, value_dim=spec["value_dim"], grid=grid, contract=contract,
                          offset_units=offset, inner_of_gateway=dep == "gateway" and spec["dp"] == "fedmem")
    inner = query
    if flower_dp:
        inner = DifferentialPrivacyClientSideFixedClipping(query, noise_multiplier=spec["flower_sigma"],
                                                           clipping_norm=spec["flower_clip"], num_sampled_clients=m)
    gw = None
    if dep == "gateway":
        acc = Accountant(spec.get("accountant", "rdp"), store=DurableStore(spec["ledger"]), name=spec["ledger_name"])
        kw = dict(num_sampled_clients=m, public_num_examples=spec["k_local"],
                  epsilon_budget=spec["epsilon_budget"], total_epsilon_budget=spec["total_epsilon_budget"],
                  delta=spec["delta"], sensitivity=spec["sensitivity"],
                  # record-level adjacency: the server enforces the public reply bound (every coordinate of a
                  # reply lies on the SecAgg+ grid in [-R, R]), the booking is one record's change
                  clip_norm=grid.clipping_range * float(np.sqrt(spec["value_dim"] + 1)))
        if flower_dp:
            gw = SupportGatewayStrategy(inner, acc, dp="flower", **kw)
        else:
            gw = SupportGatewayStrategy(inner, acc, dp="fedmem", noise_multiplier=spec["sigma"],
                                        rng=np.random.default_rng(spec["noise_seed"]), **kw)
        inner = gw
    warn = _Warnings()
    top = Recorder(inner, log_sink=warn.messages, grid=grid if contract == "fedmem" else None, offset_units=offset)

    logging.getLogger("flwr").addHandler(warn)
    server_app = ServerApp()

    @server_app.main()
    def main(grid_, context: Context) -> None:
        ctx = LegacyContext(context=context, config=ServerConfig(num_rounds=len(rounds)), strategy=top)
        secagg = SecAggPlusWorkflow(num_shares=spec["num_shares"],
                                    reconstruction_threshold=spec["reconstruction_threshold"],
                                    clipping_range=grid.clipping_range, quantization_range=grid.quantization_range,
                                    modulus_range=grid.modulus_range, max_weight=float(spec["k_local"]),
                                    timeout=spec.get("timeout_s"))
        stall = float(spec.get("stall_s", 0.0))
        # no pause after the last round: there is no next round whose SecAgg+ state a late write-back could
        # overwrite (the simulation just ends; the late ClientApp's reply is discarded)
        pauses = {r: stall for rs in (spec.get("stalls") or {}).values() for r in rs if int(r) < len(rounds)}
        wf = DefaultWorkflow(fit_workflow=_RoundDeadlines(secagg, spec.get("timeout_s"), spec.get("round_timeouts"),
                                                          pauses))
        wf(grid_, ctx)

    client_app = make_client_app(spec["world"], contract=contract, k_local=spec["k_local"],
                                 threshold=spec["threshold"], grid=grid, flower_dp=flower_dp,
                                 drops=spec.get("drops"), offset_units=offset, stalls=spec.get("stalls"),
                                 stall_s=float(spec.get("stall_s", 0.0)), bytes_log=spec.get("bytes_log"))
    init_args = local_options(spec.get("num_cpus", 2))
    init_args.pop("log_to_driver", None)
    backend = {"init_args": {**init_args, "log_to_driver": False},
               "client_resources": {"num_cpus": spec.get("client_cpus", 0.5), "num_gpus": 0.0}}
    t0 = time.perf_counter()
    with lean_private_head():   # Flower's Ray backend starts a private instance here: the same lean head as fedmem's
        run_simulation(server_app=server_app, client_app=client_app, num_supernodes=m, backend_config=backend)
    wall = time.perf_counter() - t0
    logging.getLogger("flwr").removeHandler(warn)
    # The exact SecAgg+ sums the server decoded, for the rounds whose aggregate was released (fedmem contract).
    fixed = {k: r["fixed_sum"] for k, r in top.records.items() if "fixed_sum" in r and r.get("output") is not None}
    out = {"records": [top.records[k] for k in sorted(top.records)], "fixed_sums": fixed,
           "aggregates": query.aggregates, "wall_s": wall, "gateway": None, "flwr_warnings": [w.splitlines()[0][:300] for w in warn.messages if w],
           "noise_std_on_mean": None}
    if flower_dp:   # what Flower's wrapper adds to the mean: N(0, (sigma_f C_f / num_sampled_clients)^2)
        out["noise_std_on_mean"] = spec["flower_sigma"] * spec["flower_clip"] / m
    elif gw is not None:
        out["noise_std_on_mean"] = gw.noise_std_on_sum / m
    if gw is not None:
        out["gateway"] = {"audit": [r.__dict__ for r in gw.audit], "principal": gw.principal,
                          "multiplier": gw.multiplier, "epsilon_per_round": gw.epsilon_per_round,
                          "mu_per_round": gaussian_mu(gw.plan.event()),   # exact GDP of one round's booking
                          "sampling": gw.sampling,
                          "spent": gw.gateway.principal_spent(gw.principal),
                          "total_spent": gw.gateway.accountant.spent(spec["delta"]) if gw.gateway.accountant.count
                          else 0.0}
        for a in out["gateway"]["audit"]:
            a["bookings"] = [b.__dict__ for b in a["bookings"]]
    return out


def _child(spec: dict, conn) -> None:
    try:
        conn.send(("ok", _run(spec)))
    except BaseException as e:  # noqa: BLE001 - report everything to the parent
        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def simulate(spec: dict, timeout_s: float = 600.0) -> dict:
    """Run one deployment in a spawned process (module docstring); ``RuntimeError`` if it fails."""
    _check(spec)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(spec, child), daemon=False)
    p.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise RuntimeError(f"Flower simulation did not finish within timeout_s={timeout_s!r}.")
        try:
            status, payload = parent.recv()
        except EOFError:
            status, payload = "error", f"the simulation process died (exit code {p.exitcode})"
    finally:
        p.join(timeout=60)
        if p.is_alive():
            p.terminate()
            p.join(timeout=10)
    if status != "ok":
        raise RuntimeError(f"Flower simulation failed: {payload}")
    return payload
