"""AgentClient: a small session end to end, bookings checked against what left,
broken variants caught by the same check, and a crash mid-task that loses no booked charge."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedmem.agent.client import AgentClient, AgentConfig, AgentLedger, check_bookings, default_perturber
from fedmem.agent.session import build_agents, run_session
from fedmem.experiments.agent_worlds import make_world
from fedmem.bench.shards import make_clustered_shards
from fedmem.dp import Accountant, DurableStore
from fedmem.federation.engine import Federation, FederationConfig

FCFG = FederationConfig(shards=6, records_per_shard=12, key_dim=16, value_dim=8, k=3, k_local=2, mpc="plaintext",
                        sigma=3.0, hosts=1, total_epsilon_budget=1000.0)
ACFG = AgentConfig(dpmind_chunk_tokens=128)


@pytest.fixture(scope="module")
def dpmind_parts():
    return default_perturber(ACFG.dpmind_epsilon)


@pytest.fixture(scope="module")
def data():
    return make_clustered_shards(FCFG.shards, FCFG.records_per_shard, FCFG.key_dim, FCFG.value_dim, FCFG.clip,
                                 np.random.default_rng(0), clusters=3)


@pytest.fixture(scope="module")
def fed(tmp_path_factory, data, ray_local):
    """One federation (its shard host started once) for every agent of this module: each agent
    gets its own principal from ``connect()``, so agents of different tests never share a budget."""
    store = DurableStore(tmp_path_factory.mktemp("federation") / "federation.sqlite")
    f = Federation(FCFG, data, accountant=Accountant("rdp", store=store, name="federation"),
                   rng=np.random.default_rng(1))
    yield f
    f.close()


def _agents(fed, store, worlds, dpmind_parts, agent_cls=AgentClient, seed=3):
    pert, codec = dpmind_parts
    return build_agents(worlds, fed, store, ACFG, np.random.default_rng(seed), agent_cls=agent_cls,
                        perturber=pert, codec=codec)


def _reopen(agent, world, ledger_path, fed):
    """A fresh ledger on the files (what a new process would open)."""
    return AgentLedger(agent.user, DurableStore(ledger_path), ACFG, world.pair.policy.attributes,
                       federation_store=DurableStore(fed.gateway.store.path), principal=agent.federation.principal,
                       federation_delta=FCFG.delta)


class CleanContextAgent(AgentClient):
    """Broken: books the DP-MIND epsilon but sends (essentially) the clean context."""

    def _dpmind(self, task):
        from fedmem.agent.dpmind import TokenPerturber
        from fedmem.dp import MetricLaplace

        real = self._perturber
        self._perturber = TokenPerturber(MetricLaplace(1e9, real.table.dim), real.table, real.projector)
        try:
            return super()._dpmind(task)
        finally:
            self._perturber = real


class UnderBookedAgent(AgentClient):
    """Broken: perturbs at 4x the booked epsilon (less noise than booked)."""

    def _dpmind(self, task):
        from fedmem.agent.dpmind import TokenPerturber
        from fedmem.dp import MetricLaplace

        real = self._perturber
        self._perturber = TokenPerturber(MetricLaplace(4 * real.epsilon, real.table.dim), real.table,
                                         real.projector)
        try:
            return super()._dpmind(task)
        finally:
            self._perturber = real


class SkipBraceBookingAgent(AgentClient):
    """Broken: BRACE recall computed and released without booking."""

    def _brace_recall(self, task):
        from fedmem.agent.brace.mechanism import NoiseSource, brace_run

        run = brace_run(self.brace._bank, np.asarray(task.cue)[None, :], self.brace_params,
                        NoiseSource(rng=np.random.default_rng(0), sampling="fast"))
        y = run.Y[0][-1]
        self.brace_released.append(y)
        return y


BROKEN = {"CleanContextAgent": (CleanContextAgent, "dpmind"), "UnderBookedAgent": (UnderBookedAgent, "dpmind"),
          "SkipBraceBookingAgent": (SkipBraceBookingAgent, "brace")}


@pytest.fixture(scope="module")
def session(tmp_path_factory, fed, data, dpmind_parts):
    """ONE session run for the module: two correct agents (3 tasks each) and one agent of each
    broken class (2 tasks each), all against the same federation, then the same check on every
    agent. The correct agents are the end-to-end test, the broken ones the companions.

    Power of the DP-MIND statistical part against the two broken DP-MIND agents (level
    ``dpmind_alpha`` = 1e-6): each broken agent sends 2 contexts of 192 tokens (about 400 clean
    tokens). At the booked epsilon (100) 87.6% of clean tokens survive (716/817 measured on six
    128-token contexts), with the 4x-epsilon or clean context 100% (817/817). Simulating the
    check (200,000 draws of the reference resample, binomial tokens) the broken variant is caught
    with probability 1.0 at n = 300 tokens (0.99998 at n = 272), and a correct agent is flagged
    with probability 1.6e-4 at n = 300-544."""
    pert, codec = dpmind_parts
    d = tmp_path_factory.mktemp("agents")
    store = DurableStore(d / "ledger.sqlite")
    worlds = make_world(2 + len(BROKEN), 3, data, np.random.default_rng(2), codec=codec, context_tokens=192)
    good = worlds[:2]
    broken = {}
    for (name, (cls, _)), w in zip(BROKEN.items(), worlds[2:]):
        broken[name] = dataclasses.replace(w, tasks=w.tasks[:2])
    agents = _agents(fed, store, good, dpmind_parts, seed=3)
    for i, (name, w) in enumerate(broken.items()):
        agents += _agents(fed, store, [w], dpmind_parts, agent_cls=BROKEN[name][0], seed=10 + i)
    all_worlds = good + list(broken.values())
    results = run_session(agents, all_worlds)
    problems = [check_bookings(a, w.tasks, rng=np.random.default_rng(7)) for a, w in zip(agents, all_worlds)]
    by_user = {w.user: (a, w, r, pr) for a, w, r, pr in zip(agents, all_worlds, results, problems)}
    return {"path": d / "ledger.sqlite", "good": [by_user[w.user] for w in good],
            "broken": {name: by_user[w.user] for name, w in broken.items()}, "agents": agents}


def test_session_end_to_end_bookings_match_what_left(session, fed):
    agents = session["agents"]
    assert len({a.federation.principal for a in agents}) == len(agents)     # one principal each
    for a, w, res, problems in session["good"]:
        assert type(a) is AgentClient and len(res) == 3
        assert problems == {"federation": [], "memview": [], "brace": [], "dpmind": []}, problems
        s = a.spend()
        # federation: read from the principal, equals what the principal was charged
        assert s["federation"]["releases"] == sum(not r.federation_refused for r in res)
        assert s["federation"]["epsilon"] == pytest.approx(a.federation.epsilon_spent)
        assert s["brace"]["releases"] == sum(r.brace is not None for r in res) == 3
        assert s["dpmind"]["contexts"] == 3 and s["dpmind"]["epsilon_per_token"] == ACFG.dpmind_epsilon
        assert max(len(x["chunks"]) for x in a.dpmind_sent) >= 2             # contexts span several chunks
        # nothing private in what the app or the external model saw
        for msgs in a.app.messages:
            for item in w.pair.stores["M"].items:
                assert item not in msgs[-1]["content"]
        for t in w.tasks:
            for msgs in a.external.messages:
                assert t.context not in msgs[-1]["content"]
        # durable: a fresh ledger on the same files reads the same spend
        assert _reopen(a, w, session["path"], fed).summary() == s
        c = a.ledger.composed(1e-5)
        assert c["epsilon"] >= max(s["brace"]["epsilon"], s["memview"]["max_epsilon"])


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_agents_are_caught_by_the_same_check(session, name):
    a, w, res, problems = session["broken"][name]
    cls, boundary = BROKEN[name]
    assert type(a) is cls and len(res) == 2
    assert problems[boundary], problems
    assert all(not p for b, p in problems.items() if b != boundary), problems


class Boom(RuntimeError):
    pass


class CrashingResponder:
    def respond(self, messages):
        raise Boom("external model died mid-task")


def test_crash_mid_task_loses_no_booked_charge(tmp_path, fed, data, dpmind_parts):
    store = DurableStore(tmp_path / "ledger.sqlite")
    worlds = make_world(1, 2, data, np.random.default_rng(5), codec=dpmind_parts[1], context_tokens=128)
    a, w = _agents(fed, store, worlds, dpmind_parts, seed=6)[0], worlds[0]
    a.step(w.tasks[0])
    a.external = type(a.external)(CrashingResponder())
    with pytest.raises(Boom):
        a.step(w.tasks[1])           # crashes after federation, BRACE, DP-MemView and DP-MIND booked
    before = a.spend()
    assert before["brace"]["releases"] == 2 and before["dpmind"]["contexts"] == 2
    assert before["federation"]["releases"] == 2
    assert _reopen(a, w, tmp_path / "ledger.sqlite", fed).summary() == before    # as a new process reads them


def test_agent_config_validation_names_parameter():
    with pytest.raises(ValueError, match="memview_cap"):
        AgentConfig(memview_cap=0)
    with pytest.raises(ValueError, match="brace_delta"):
        AgentConfig(brace_delta=2.0)
    with pytest.raises(ValueError, match="dpmind_token_cap"):
        AgentConfig(dpmind_token_cap=-1.0)
