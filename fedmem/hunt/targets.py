"""Systems the hunter attacks, built from a scenario and run in process (no Ray, plaintext MPC).

Every target turns the scenario into a list of :class:`Arm` s: one hypothesis each, a pair of
neighbouring worlds (:mod:`fedmem.hunt.worlds`) and a query sequence (:mod:`fedmem.hunt.grammar`).
``arm.trial(w)`` plays one trial in world ``w`` (0 or 1) through the public interface only and
returns the named leaves of everything observed (:mod:`fedmem.hunt.observe`) and what the
system booked for that trial (``{"eps", "mu"}``: its own accountant's charge).

* :class:`EngineTarget` (``federation.*``): the real :class:`~fedmem.federation.engine.Federation`
  (gateway, engine, shard-host code, sealed share packets, plaintext reference parties,
  aggregator, secure samplers, SQLite ledgers); only the shard hosts run in this process
  instead of as Ray actors (:class:`InProcessEngine`: the same :class:`ShardHostCore` the actors
  wrap) so that one query costs milliseconds. A fresh principal per trial (a Sybil); what it sees:
  every field of the response or the exception, its time, and its own spend.
* :class:`LedgerTarget` (``federation.*``): the same federation seen by an agent through its
  :class:`~fedmem.agent.ledger.AgentLedger`: the booked figure is what the agent's ledger says.
* :class:`FlowerTarget` (``flower.*``): the legacy wrapper
  :class:`~fedmem.flower.gateway.SupportGatewayStrategy` driven in process, round by round
  (``configure_fit`` then ``aggregate_fit`` with synthetic replies): one honest target client,
  honest others and one hostile contributor whose reply the world search chooses; what the
  caller sees (the aggregate or nothing, every exception, the time) and what the hostile
  contributor sees of its own round (the same aggregate: the next global model).
"""

from __future__ import annotations

import inspect
import math
from contextlib import contextmanager
from unittest import mock

import numpy as np

from fedmem.hunt import grammar, worlds
from fedmem.hunt.observe import capture, flatten


class Arm:
    """One hypothesis: a name, its JSON-able recipe parts, and ``trial(w) -> (leaves, booked)``."""

    def __init__(self, target: str, world: dict, strategy: dict, trial, close=None):
        self.target, self.world, self.strategy = target, world, strategy
        self._trial, self._close = trial, close
        self.name = f"{target}/{world['name']}/{grammar.name_of(strategy)}"

    def trial(self, w: int):
        return self._trial(w)

    def close(self):
        if self._close is not None:
            self._close()


def _mu_of_events(events) -> float | None:
    from fedmem.dp.events import gaussian_mu

    mus = [gaussian_mu(e) for e in events]
    if any(m is None for m in mus):
        return None
    return math.sqrt(sum(m * m for m in mus))


# ------------------------------------------------------------------ engine, in process
def _inprocess_engine_class():
    from fedmem.federation import compute
    from fedmem.federation.shard_host import ShardHostCore
    from fedmem.federation.sharing import seal_packet

    class InProcessEngine(compute.Engine):
        """:class:`~fedmem.federation.compute.Engine` with its shard hosts in this process (the same
        :class:`ShardHostCore` the Ray actors wrap; packets sealed to their party exactly as
        ``candidates_refs`` seals them, handed over by value)."""

        def _start_hosts(self):
            self._hosts = []
            for h in range(len(self._split)):
                args, kw = self._host_args(h)
                self._hosts.append(ShardHostCore(*args, **kw))
            self._starting = []

        def _await_hosts(self):
            return None

        def _heal_hosts(self):
            return None

        def packets(self, q, mode, keys=None, run_id=None):
            P = self.config.parties
            metas = []
            for h in self._hosts:
                pk = h.candidates(q, mode, compress=keys is not None)
                if keys is not None:
                    pk = [seal_packet(p, bytes(k), run_id, r) for r, (p, k) in enumerate(zip(pk, keys))]
                metas.append(pk)
            return [[m[p] for m in metas] for p in range(P)]

        def ground_truth_many(self, qs):
            raise NotImplementedError("the hunter never reads the ground truth")

        def close(self):
            self._closed = True

    return InProcessEngine


@contextmanager
def _no_ray():
    from fedmem.federation import compute
    from fedmem.federation import engine as eng

    with mock.patch.object(compute, "ensure_ray", lambda *a, **k: False), \
            mock.patch.object(eng, "Engine", _inprocess_engine_class()):
        yield


def build_federation(fed_cfg: dict, data, seed: int):
    """A real Federation over ``data`` with in-process shard hosts and the plaintext reference parties."""
    from fedmem.dp import Accountant
    from fedmem.federation.config import FederationConfig
    from fedmem.federation.engine import Federation

    names = {f for f in inspect.signature(FederationConfig).parameters}
    cfg = {k: v for k, v in fed_cfg.items() if k in names}
    cfg.update(mpc="plaintext", hosts=min(int(cfg.get("hosts", 2)), 2))
    with _no_ray():
        return Federation(FederationConfig(**cfg), data, accountant=Accountant("rdp"),
                          rng=np.random.default_rng(seed))


class EngineTarget:
    name = "engine"

    def __init__(self, scenario_cfg: dict, seed: int, *, strategies=None, world_kinds=None):
        from fedmem.bench.shards import clustered_data

        fc = dict(scenario_cfg["federation"])
        # the games lift the budgets (a budget refusal is public; lifting it only helps the adversary);
        # budget exhaustion is its own strategy on the scenario's real budgets
        self.real_budgets = {k: fc.get(k) for k in ("epsilon_budget", "total_epsilon_budget",
                                                     "support_budget_bits", "total_support_budget_bits")}
        for k in self.real_budgets:
            fc[k] = math.inf
        self.fed_cfg = fc
        dc = scenario_cfg.get("data", {})
        self.data = clustered_data(fc["shards"], fc["records_per_shard"], fc["key_dim"], fc["value_dim"],
                                   fc.get("clip", 1.0), np.random.default_rng(seed),
                                   clusters=dc.get("clusters", 12), spread=dc.get("spread", 0.35))
        self.seed = seed
        self.rng = np.random.default_rng(seed + 1)
        self.pairs = worlds.engine_worlds(self.data, fc, self.rng, kinds=world_kinds)
        self.strategies = strategies or grammar.ENGINE_STRATEGIES
        self._feds: list = []

    def _pair(self, wp):
        if "feds" not in wp:
            wp["feds"] = [build_federation(self.fed_cfg, wp["data"][w], self.seed * 7 + 11 + w) for w in (0, 1)]
            self._feds += wp["feds"]
        return wp["feds"]

    def arms(self) -> list[Arm]:
        out = []
        for wp in self.pairs:
            for st in self.strategies:
                out.append(Arm(self.name, wp["spec"], st, self._trial_fn(wp, st)))
        return out

    def _trial_fn(self, wp, st):
        rng = np.random.default_rng(abs(hash((wp["spec"]["name"], grammar.name_of(st)))) % (2**32))

        def trial(w):
            fed = self._pair(wp)[w]
            return engine_sequence(fed, wp["query"], st, rng)
        return trial

    def close(self):
        for f in self._feds:
            f.close()


def engine_sequence(fed, q, st: dict, rng, *, ledger_reader=None):
    """Play one query sequence (:mod:`fedmem.hunt.grammar`) against ``fed``, each principal fresh."""
    from fedmem.attacks.observable import near_duplicates

    clients, labels = {}, {}
    steps = grammar.steps(st)
    near = near_duplicates(q, max(1, sum(s["q"] == "near" for s in steps)), st.get("radius", 0.02), rng)
    ni = 0
    seq = []
    first_id: dict[int, int] = {}
    for s in steps:
        p = s["p"]
        if p not in clients:
            clients[p] = fed.connect()
            labels[p] = clients[p].principal.label if hasattr(clients[p], "principal") else None
        c = clients[p]
        if s["q"] == "near":
            qq = near[ni]
            ni += 1
        else:
            qq = q
        retry = first_id.get(p) if s.get("retry") else None
        obs = capture(lambda: c.retrieve(qq, retry_of=retry))
        if obs["ok"] and p not in first_id:
            first_id[p] = int(getattr(obs["result"], "query_id", 0))
        elif not obs["ok"] and p not in first_id:
            qid = (obs["exc"] or {}).get("attrs", {}).get("query_id")
            if qid is not None:
                first_id[p] = int(qid)
        obs["spent"] = float(fed.spent(c.principal)) if hasattr(c, "principal") else None
        seq.append(obs)
        if st.get("until_refused") and not obs["ok"]:
            break
    leaves = grammar.sequence_leaves(seq)
    eps, mus = 0.0, []
    gw = fed.gateway
    for p, lab in labels.items():
        e, m = gw.principal_booked(gw.resolve(clients[p].principal))
        eps += e
        mus.append(m)
    mu = None if any(m is None for m in mus) else math.sqrt(sum(m * m for m in mus))
    if ledger_reader is not None:
        eps, mu = ledger_reader(fed, [clients[p].principal for p in clients])
    return leaves, {"eps": eps, "mu": mu}


class LedgerTarget(EngineTarget):
    """The federation seen through an agent's :class:`~fedmem.agent.ledger.AgentLedger`: the figure the
    agent's user is told was spent is what the verdict compares with."""

    name = "ledger"

    def __init__(self, scenario_cfg: dict, seed: int):
        super().__init__(scenario_cfg, seed, strategies=grammar.LEDGER_STRATEGIES, world_kinds=("replace",))

    def _trial_fn(self, wp, st):
        rng = np.random.default_rng(abs(hash(("ledger", wp["spec"]["name"], grammar.name_of(st)))) % (2**32))

        def read(fed, principals):
            from fedmem.agent.config import AgentConfig
            from fedmem.agent.ledger import AgentLedger
            from fedmem.dp import DurableStore

            eps, mus = 0.0, []
            for pr in principals:
                led = AgentLedger("u", DurableStore(), AgentConfig(), ["a"],
                                  federation_store=fed.accountant.store, federation_accountant=fed.accountant.name,
                                  principal=pr.label, federation_delta=fed.config.delta)
                eps += led.federation_epsilon()
                mus.append(_mu_of_events([e for e, _ in led.federation_bookings()]))
            return eps, (None if any(m is None for m in mus) else math.sqrt(sum(m * m for m in mus)))

        def trial(w):
            fed = self._pair(wp)[w]
            return engine_sequence(fed, wp["query"], st, rng, ledger_reader=read)
        return trial


# ------------------------------------------------------------------ Flower wrapper, in process
class _Proxy:
    def __init__(self, node_id):
        self.node_id = node_id


class _Manager:
    def __init__(self, n):
        self.proxies = [_Proxy(100 + i) for i in range(n)]


def _mean_strategy(dim: int):
    from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import Strategy

    class _Mean(Strategy):
        """Inner strategy: the unweighted mean of the replies (a user's FedAvg on equal weights)."""

        fedmem_mean_aggregate = True

        def initialize_parameters(self, client_manager):
            return ndarrays_to_parameters([np.zeros(dim)])

        def configure_fit(self, server_round, parameters, client_manager):
            return [(p, FitIns(parameters, {})) for p in client_manager.proxies]

        def aggregate_fit(self, server_round, results, failures):
            xs = [parameters_to_ndarrays(r.parameters)[0] for _, r in results]
            return ndarrays_to_parameters([np.mean(xs, axis=0)]), {}

        def configure_evaluate(self, *a):
            return []

        def aggregate_evaluate(self, *a):
            return None, {}

        def evaluate(self, *a):
            return None

    return _Mean()


class FlowerTarget:
    name = "flower"

    def __init__(self, scenario_cfg: dict, seed: int):
        fc = scenario_cfg["federation"]
        self.seed = seed
        self.m = max(3, min(int(fc.get("num_shares", 5)), 5))
        self.k = int(fc.get("k_local", 5))
        self.clip = float(fc.get("clip", 1.0))
        self.delta = float(fc.get("delta", 1e-6))
        self.configs = worlds.flower_configs(float(fc.get("sigma", 1.2)), int(fc.get("value_dim", 16)))
        self.pairs = worlds.flower_worlds(self.configs, self.clip, np.random.default_rng(seed + 2))
        for wp in self.pairs:
            wp["replies"] = worlds.flower_replies(wp, self.m)

    def _strategy(self, cfg: dict, w: int):
        from fedmem.dp import Accountant
        from fedmem.flower.gateway import SupportGatewayStrategy

        kw = dict(num_sampled_clients=self.m, dp="fedmem", noise_multiplier=cfg["sigma"], sensitivity=self.clip,
                  public_num_examples=self.k, epsilon_budget=math.inf, total_epsilon_budget=math.inf,
                  delta=self.delta, rng=np.random.default_rng(self.seed * 13 + w))
        return SupportGatewayStrategy(_mean_strategy(cfg["dim"]), Accountant("rdp"), **kw)

    def arms(self) -> list[Arm]:
        return [Arm(self.name, wp["spec"], {"op": "round"}, self._trial_fn(wp)) for wp in self.pairs]

    def _trial_fn(self, wp):
        from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

        state = {"gw": None, "round": [0, 0]}

        def trial(w):
            if state["gw"] is None:
                state["gw"] = [capture(lambda: self._strategy(wp["cfg"], i)) for i in (0, 1)]
            built = state["gw"][w]
            if not built["ok"]:    # a configuration the wrapper refuses at construction: that is what is seen
                return {"construct": built["exc"]}, {"eps": 0.0, "mu": 0.0}
            gw = built["result"]
            state["round"][w] += 1
            rnd = state["round"][w]
            e0, m0 = gw.gateway.principal_booked(gw.principal)
            cm = _Manager(self.m)
            replies = wp["replies"][w]

            def one_round():
                ins = gw.configure_fit(rnd, gw.initialize_parameters(cm), cm)
                if not ins:
                    return {"configured": 0}
                results = [(p, FitRes(Status(Code.OK, ""), ndarrays_to_parameters([np.array(x, copy=True)]),
                                      self.k, {})) for (p, _), x in zip(ins, replies)]
                params, metrics = gw.aggregate_fit(rnd, results, [])
                return {"configured": len(ins), "params": None if params is None else parameters_to_ndarrays(params),
                        "metrics": metrics}

            obs = capture(one_round)
            e1, m1 = gw.gateway.principal_booked(gw.principal)
            mu = None if (m0 is None or m1 is None) else math.sqrt(max(0.0, m1 * m1 - m0 * m0))
            return flatten(obs), {"eps": max(0.0, e1 - e0), "mu": mu}
        return trial

    def close(self):
        return None


def targets_for(kind: str, scenario_cfg: dict, seed: int) -> list:
    """The targets of a scenario kind (``federation.*``: engine + agent ledger; ``flower.*``: the wrapper)."""
    family = kind.split(".", 1)[0]
    if family == "federation":
        return [EngineTarget(scenario_cfg, seed), LedgerTarget(scenario_cfg, seed)]
    if family == "flower":
        return [FlowerTarget(scenario_cfg, seed)]
    if family == "agents":
        return [LedgerTarget(scenario_cfg, seed)]
    raise ValueError(f"scenario kind must be a federation.*, flower.* or agents.* scenario for fedmem hunt. "
                     f"Found {kind!r}.")
