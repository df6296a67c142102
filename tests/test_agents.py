"""AgentClient (issue 11): a small session end to end, bookings checked against what left,
broken variants caught by the same check, and a crash mid-task that loses no booked charge."""

from __future__ import annotations

import numpy as np
import pytest

from fedmem.agent.client import AgentClient, AgentConfig, AgentLedger, check_bookings, default_perturber
from fedmem.agent.session import build_agents, make_world, run_session
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


def _session(tmp_path, data, dpmind_parts, agent_cls=AgentClient, n=2, tasks=3, seed=1):
    pert, codec = dpmind_parts
    store = DurableStore(tmp_path / "ledger.sqlite")
    fed = Federation(FCFG, data, accountant=Accountant("rdp", store=store, name="federation"),
                     rng=np.random.default_rng(seed))
    worlds = make_world(n, tasks, data, np.random.default_rng(seed + 1), codec=codec, context_tokens=192)
    agents = build_agents(worlds, fed, store, ACFG, np.random.default_rng(seed + 2), agent_cls=agent_cls,
                          perturber=pert, codec=codec)
    return fed, store, worlds, agents


def test_session_end_to_end_bookings_match_what_left(tmp_path, data, dpmind_parts, ray_local):
    fed, store, worlds, agents = _session(tmp_path, data, dpmind_parts)
    with fed:
        results = run_session(agents, worlds)
        assert len({a.federation.principal for a in agents}) == len(agents)     # one principal each
        for a, w, res in zip(agents, worlds, results):
            assert len(res) == 3
            problems = check_bookings(a, w.tasks, rng=np.random.default_rng(7))
            assert problems == {"federation": [], "memview": [], "brace": [], "dpmind": []}, problems
            s = a.spend()
            # federation: read from the principal, equals what the principal was charged
            assert s["federation"]["releases"] == sum(not r.federation_refused for r in res)
            assert s["federation"]["epsilon"] == pytest.approx(a.federation.epsilon_spent)
            assert s["brace"]["releases"] == sum(r.brace is not None for r in res) == 3
            assert s["dpmind"]["contexts"] == 3 and s["dpmind"]["epsilon_per_token"] == ACFG.dpmind_epsilon
            # nothing private in what the app or the external model saw
            for msgs in a.app.messages:
                for item in w.pair.stores["M"].items:
                    assert item not in msgs[-1]["content"]
            for t in w.tasks:
                for msgs in a.external.messages:
                    assert t.context not in msgs[-1]["content"]
            # durable: a fresh ledger on the same file reads the same spend
            fresh = AgentLedger(a.user, DurableStore(tmp_path / "ledger.sqlite"), ACFG,
                                w.pair.policy.attributes, federation_store=DurableStore(tmp_path / "ledger.sqlite"),
                                principal=a.federation.principal, federation_delta=FCFG.delta)
            assert fresh.summary() == s
            c = a.ledger.composed(1e-5)
            assert c["epsilon"] >= max(s["brace"]["epsilon"], s["memview"]["max_epsilon"])


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


@pytest.mark.parametrize("cls, boundary", [(CleanContextAgent, "dpmind"), (UnderBookedAgent, "dpmind"),
                                           (SkipBraceBookingAgent, "brace")])
def test_broken_agents_are_caught_by_the_same_check(tmp_path, data, dpmind_parts, ray_local, cls, boundary):
    fed, store, worlds, agents = _session(tmp_path, data, dpmind_parts, agent_cls=cls, n=1, tasks=2)
    with fed:
        run_session(agents, worlds)
        problems = check_bookings(agents[0], worlds[0].tasks, rng=np.random.default_rng(7))
    assert problems[boundary], problems
    assert all(not p for b, p in problems.items() if b != boundary), problems


class Boom(RuntimeError):
    pass


class CrashingResponder:
    def respond(self, messages):
        raise Boom("external model died mid-task")


def test_crash_mid_task_loses_no_booked_charge(tmp_path, data, dpmind_parts, ray_local):
    fed, store, worlds, agents = _session(tmp_path, data, dpmind_parts, n=1, tasks=2)
    a, w = agents[0], worlds[0]
    with fed:
        a.step(w.tasks[0])
        a.external = type(a.external)(CrashingResponder())
        with pytest.raises(Boom):
            a.step(w.tasks[1])           # crashes after federation, BRACE, DP-MemView and DP-MIND booked
        before = a.spend()
    assert before["brace"]["releases"] == 2 and before["dpmind"]["contexts"] == 2
    assert before["federation"]["releases"] == 2
    other = DurableStore(tmp_path / "ledger.sqlite")       # a new process would open the file like this
    fresh = AgentLedger(a.user, other, ACFG, w.pair.policy.attributes, federation_store=other,
                        principal=a.federation.principal, federation_delta=FCFG.delta)
    assert fresh.summary() == before


def test_agent_config_validation_names_parameter():
    with pytest.raises(ValueError, match="memview_cap"):
        AgentConfig(memview_cap=0)
    with pytest.raises(ValueError, match="brace_delta"):
        AgentConfig(brace_delta=2.0)
    with pytest.raises(ValueError, match="dpmind_token_cap"):
        AgentConfig(dpmind_token_cap=-1.0)
