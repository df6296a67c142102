"""Agents as Ray actors: one actor per user against one federation service,
a killed agent actor loses no booked charge (a late-booking agent is caught by the same
test), and every ledger survives a SIGKILL of the driver."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedmem.agent.client import AgentConfig
from fedmem.agent.session import ActorSession
from fedmem.experiments.agent_worlds import make_world
from fedmem.bench.shards import make_clustered_shards
from tests.agent.agent_doubles import LateBooking, SlowAfterRelease, lost_charges
from fedmem.federation.engine import FederationConfig

FCFG = FederationConfig(shards=6, records_per_shard=12, key_dim=16, value_dim=8, k=3, k_local=2, mpc="plaintext",
                        sigma=3.0, hosts=1, total_epsilon_budget=1000.0)
ACFG = AgentConfig(dpmind_chunk_tokens=128)
WORKER = Path(__file__).with_name("agents_driver_worker.py")


@pytest.fixture(scope="module")
def data():
    return make_clustered_shards(FCFG.shards, FCFG.records_per_shard, FCFG.key_dim, FCFG.value_dim, FCFG.clip,
                                 np.random.default_rng(0), clusters=3)


PROJECTOR = ("fedmem-test-projector", "fedmem-tests")     # (name, namespace): the driver subprocess reuses it


@pytest.fixture(scope="module")
def projector(ray_local):
    """One nearest-token search service for the module (it loads the MiniLM index once); named,
    so that the driver subprocess of the SIGKILL test uses it too instead of building its own."""
    from fedmem.agent.federation_service import ProjectorService

    h = ray_local.remote(num_cpus=0.05, max_restarts=0)(ProjectorService).options(
        name=PROJECTOR[0], namespace=PROJECTOR[1]).remote("cascade")
    ray_local.get(h.ping.remote())
    yield h
    ray_local.kill(h, no_restart=True)


@pytest.fixture(scope="module")
def codec():
    from fedmem.agent.dpmind import load_minilm

    return load_minilm()[1]



def test_ledgers_survive_sigkill_of_the_driver(tmp_path, projector, ray_local, subprocess_env):
    """A second driver (a subprocess joined to the session's Ray: the process boundary is what is
    tested, not a Ray start) runs an actor session, prints its spend, and is SIGKILLed; every
    ledger file reads back that spend. Ray then kills that driver's actors (its job died)."""
    from fedmem.agent.client import AgentLedger
    from fedmem.dp import DurableStore

    out = tmp_path / "run"
    gcs = ray_local.get_runtime_context().gcs_address
    proc = subprocess.Popen([sys.executable, str(WORKER), str(out), gcs, *PROJECTOR], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True, env=dict(subprocess_env))
    try:
        line = ""
        deadline = time.monotonic() + 150
        while not line.startswith("{"):
            assert time.monotonic() < deadline and proc.poll() is None, "driver did not finish its session"
            line = proc.stdout.readline()
        report = json.loads(line)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)     # Ray processes this driver started, if any are left
        except ProcessLookupError:
            pass
    import importlib.util

    spec = importlib.util.spec_from_file_location("agents_driver_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    _, worlds = worker.world()
    assert set(report["spend"]) == {w.user for w in worlds} and not report["dead"]
    for w in worlds:
        led = AgentLedger(w.user, DurableStore(out / "ledgers" / f"{w.user}.sqlite"), worker.ACFG,
                          w.pair.policy.attributes, federation_store=DurableStore(out / "federation.sqlite"),
                          principal=report["principals"][w.user], federation_delta=worker.FCFG.delta)
        s = led.summary()
        assert s == report["spend"][w.user]
        assert s["federation"]["releases"] == s["brace"]["releases"] == s["dpmind"]["contexts"] == 2


@pytest.mark.parametrize("override, key", [("agents.actor_cpus=0", "agents.actor_cpus"),
                                           ("agents.check_contexts=-1", "agents.check_contexts"),
                                           ("attacks.peer_trials=3", "attacks.peer_trials"),
                                           ("agents.n=0", "agents.n")])
def test_bad_agent_configuration_names_file_and_key(override, key):
    from fedmem.errors import ScenarioError
    from fedmem.registry import load_scenario

    path = Path(__file__).resolve().parents[2] / "scenarios" / "agents_session.toml"
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, [override])
    assert key in str(info.value) and "agents_session.toml" in str(info.value)


class LeakyProxy:
    """Broken service (a Ray actor in front of a real ``FederationService``): the release is booked
    as usual (by the service behind it) but the exact selected mean is handed back."""

    def __init__(self, service):
        self._s = service

    def connect(self):
        import ray

        return ray.get(self._s.connect.remote())

    def retrieve(self, principal, q, family=None, retry_of=None):
        import ray

        r = ray.get(self._s.retrieve.remote(principal, q, family, retry_of))
        if isinstance(r, tuple):
            return r
        t = ray.get(self._s.ground_truth_many.remote(np.asarray(q, dtype=np.float64)[None]))[0]
        return dataclasses.replace(r, value=np.asarray(t.sum, float) / max(int(t.count), 1))

    def principal_spent(self, principal):
        import ray

        return ray.get(self._s.principal_spent.remote(principal))

    def ground_truth_many(self, qs):
        import ray

        return ray.get(self._s.ground_truth_many.remote(qs))


def test_peer_game_within_booked_epsilon_and_catches_a_leaky_federation(tmp_path, data, ray_local):
    """The curious peer's game: against the real federation no ROC point is provably above the
    booked epsilon's DP ceiling; against one that books the same but releases the exact mean,
    the same game finds such points. The leaky variant is a proxy in front of the same two
    services (one federation per world, not four): each trial has a fresh principal, so the
    games do not share a per-principal budget."""
    import ray.cloudpickle

    from fedmem.attacks.agent_boundaries import federation_games, pick_target
    from fedmem.agent.federation_service import start_federation_service
    from fedmem.bench.shards import without_record

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    target = pick_target(data, np.random.default_rng(3))
    svc = start_federation_service(FCFG, data, tmp_path / "with.sqlite", seed=1)
    nb = start_federation_service(FCFG, without_record(data, target[0], target[1]), tmp_path / "without.sqlite",
                                  seed=2)
    proxy = ray_local.remote(num_cpus=0, max_restarts=0)(LeakyProxy)
    leaky_svc, leaky_nb = proxy.remote(svc), proxy.remote(nb)
    out = {}
    try:
        for name, pair in (("real", (svc, nb)), ("leaky", (leaky_svc, leaky_nb))):
            out[name] = federation_games(*pair, target, 60, np.random.default_rng(9), delta=FCFG.delta)["peer"]
    finally:
        for h in (leaky_svc, leaky_nb, svc, nb):
            ray_local.kill(h, no_restart=True)
    real, leaky = out["real"], out["leaky"]
    assert real["queries_whose_selection_changes"] >= 30          # the target matters to these queries
    assert real["defended"]["ceiling_violations"] == 0
    assert real["defended"]["eps_lower"] <= real["booked"]["max"]
    assert leaky["booked"]["max"] == pytest.approx(real["booked"]["max"])   # same booking ...
    assert leaky["defended"]["ceiling_violations"] > 0                     # ... but provably more leaked


def test_agents_that_cannot_all_be_placed_are_refused_at_load():
    from fedmem.errors import ScenarioError
    from fedmem.registry import load_scenario

    path = Path(__file__).resolve().parents[2] / "scenarios" / "agents_session.toml"
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, ["agents.mode=cluster", "agents.actor_cpus=0.5"])   # 100 x 0.5 Ray CPUs here
    assert "agents.actor_cpus" in str(info.value)
    load_scenario(path, [])                                        # the shipped file fits


# ---- one actor session shared by the two tests below (last in the module: its actors live only while they run)
@pytest.fixture(scope="module")
def actor_run(tmp_path_factory, data, codec, projector, ray_local):
    """ONE actor session for the module: three correct agents (2 tasks each) and two agents
    killed mid-task 1 (3 tasks each), after its context reached the external model: a correct
    one (``SlowAfterRelease``: nothing may be lost) and a late-booking one (``LateBooking``:
    caught by the same test). One federation service, gate, observers and projector for all."""
    import ray.cloudpickle

    from tests.agent import agent_doubles

    ray.cloudpickle.register_pickle_by_value(agent_doubles)          # the agent classes live there
    worlds = make_world(5, 3, data, np.random.default_rng(1), codec=codec, context_tokens=128)
    worlds = [dataclasses.replace(w, tasks=w.tasks[:2]) for w in worlds[:3]] + worlds[3:]
    good, broken = worlds[3].user, worlds[4].user
    s = ActorSession(worlds, FCFG, data, ACFG, tmp_path_factory.mktemp("actors"), seed=3, projector=projector,
                     agent_cls={good: SlowAfterRelease, broken: LateBooking})
    try:
        s.submit()
        flags = {u: s.ledger_paths[u].with_suffix(".released") for u in (good, broken)}
        deadline = time.monotonic() + 300
        for u, flag in flags.items():
            while not flag.exists():
                assert time.monotonic() < deadline, f"agent {u} never reached task 1"
                time.sleep(0.05)
            ray.kill(s.actors[u], no_restart=True)                   # mid-task 1: the step never returns
        res = s.gather()
        yield {"session": s, "worlds": worlds, "results": res, "killed": (good, broken), "flags": flags,
               "bystanders": [w.user for w in worlds[:3]]}
    finally:
        s.close()


def test_actor_session_one_federation_bookings_match(actor_run):
    import ray

    s, res = actor_run["session"], actor_run["results"]
    assert set(s.dead) == set(actor_run["killed"]) and not s.failed       # only the two killed on purpose
    assert len(set(s.principals.values())) == 5                           # one principal per agent
    users = actor_run["bystanders"]
    assert all(len(res[u]) == 2 for u in users)
    checks = s.call("check", 7)
    assert set(checks) == set(users)
    for u, c in checks.items():
        assert c == {"federation": [], "memview": [], "brace": [], "dpmind": []}, (u, c)
    spend = s.call("spend")
    audit = ray.get(s.fed.audit.remote())
    for w in actor_run["worlds"][:3]:
        u = w.user
        # the federation's own audit: this principal's admitted releases = the agent's booked releases
        admitted = sum(1 for a in audit if a.principal == s.principals[u] and a.decision.startswith("admitted"))
        assert spend[u]["federation"]["releases"] == admitted == 2
        assert s.reopen_ledger(u).summary() == spend[u]               # durable, read from the files
        app = ray.get(s.app.messages.remote(u))
        ext = ray.get(s.external.messages.remote(u))
        assert len(app) == 2 and ext
        for msgs in app:                                             # no private memory reached the app
            assert not any(item in msgs[-1]["content"] for item in w.pair.stores["M"].items)
        for msgs in ext:                                             # no clean context reached the provider
            assert not any(t.context in msgs[-1]["content"] for t in w.tasks)


def test_killed_agent_actor_loses_no_booked_charge(actor_run):
    """Two agents were killed mid-task 1, after its context reached the external model: the
    correct one lost nothing, the late-booking one is caught by the same test; the others went on."""
    import ray

    s, res = actor_run["session"], actor_run["results"]
    good, broken = actor_run["killed"]
    assert all([r.task for r in res[u]] == [0, 1] for u in actor_run["bystanders"])   # the others went on
    audit = ray.get(s.fed.audit.remote())
    problems = {}
    for u in (good, broken):
        assert s.dead[u]["task"] == 1 and sorted(s.dead[u]["lost_tasks"]) == [1, 2]
        assert [r.task for r in res[u]] == [0]
        feds = sum(1 for a in audit if a.principal == s.principals[u] and a.decision.startswith("admitted"))
        released = int(actor_run["flags"][u].read_text())
        assert released == 2 and ray.get(s.external.count.remote(u)) > 0
        problems[u] = lost_charges(s.reopen_ledger(u), released, feds)
    assert problems[good] == []
    assert problems[broken] and problems[broken][0].startswith("dpmind"), problems
