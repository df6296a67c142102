"""Real boundaries: principals are capabilities, agents get no operator handle,
and an isolated agent (own OS process outside Ray, own uid and network namespace when
run as root) reaches nothing of the federation but its narrow RPC.

Each attack of the issue is one assertion here: forge a principal, guess the next id,
call operator methods from an agent, edit the federation ledger from an agent, enumerate
and enter Ray actors from an agent. The same probe run from an in-cluster agent (Ray
actor) *does* see the cluster: that companion shows the probe can fail, and documents
that the in-cluster mode only simulates the boundary.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from fedmem.agent.client import AgentClient, AgentConfig
from fedmem.bench.shards import make_clustered_shards
from fedmem.dp import Accountant, DurableStore
from fedmem.errors import SupportPrivacyViolation
from tests.agent.agent_doubles import LateBooking, SlowAfterRelease, lost_charges
from fedmem.federation.engine import Federation, FederationConfig
from fedmem.federation.gateway import Principal

FCFG = FederationConfig(shards=6, records_per_shard=12, key_dim=16, value_dim=8, k=3, k_local=2, mpc="plaintext",
                        sigma=3.0, hosts=1, epsilon_budget=4.0, total_epsilon_budget=1000.0)
ACFG = AgentConfig(dpmind_chunk_tokens=128)
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture(scope="module")
def data():
    return make_clustered_shards(FCFG.shards, FCFG.records_per_shard, FCFG.key_dim, FCFG.value_dim, FCFG.clip,
                                 np.random.default_rng(0), clusters=3)


def _shape(exc):
    """Everything an agent can observe of a refusal except the public query id."""
    attrs = {k: v for k, v in vars(exc).items() if k != "query_id"}
    return type(exc), str(exc), repr(exc.args), tuple(sorted(vars(exc))), repr(sorted(attrs.items()))


def test_forged_guessed_and_known_labels_are_refused_uniformly(tmp_path, data, ray_local):
    store = DurableStore(tmp_path / "fed.sqlite")
    q = np.random.default_rng(2).normal(size=FCFG.key_dim)
    with Federation(FCFG, data, accountant=Accountant("rdp", store=store, name="fed"),
                    rng=np.random.default_rng(1)) as f:
        clients = [f.connect() for _ in range(4)]
        labels = [str(c.principal) for c in clients]
        assert all(re.fullmatch(r"p-[0-9a-f]{16}", lbl) for lbl in labels)        # random, not p1, p2, ...
        assert len({int(lbl[2:], 16) for lbl in labels}) == 4
        assert all(isinstance(c.principal, Principal) and len(c.principal.capability) == 32 for c in clients)
        # a real refusal (budget) to compare with
        own = clients[0]
        answered = 0
        budget_refusal = None
        for _ in range(30):
            try:
                own.retrieve(q)
                answered += 1
            except SupportPrivacyViolation as exc:
                budget_refusal = exc
        assert 0 < answered < 30 and budget_refusal is not None
        # forged, guessed and known-but-not-held principals: every query refused, same shape
        forged = ["p1", "p2", f"p-{'0' * 16}", labels[1], labels[2], "anonymous", "", "x" * 32,
                  Principal(labels[1], "0" * 32)]
        got = f.retrieve_many(np.repeat(q[None], len(forged), axis=0), principal=forged)
        assert all(isinstance(r, SupportPrivacyViolation) for r in got)
        assert {_shape(r) for r in got} == {_shape(budget_refusal)}
        for p in forged:
            with pytest.raises(SupportPrivacyViolation) as info:
                f.retrieve(q, principal=p)
            assert _shape(info.value) == _shape(budget_refusal)
        # a client built on someone's label: refused, and reads 0 as its spend (not the owner's)
        from fedmem.federation.client import MemoryClient

        thief = MemoryClient(f, principal=labels[0])
        with pytest.raises(SupportPrivacyViolation):
            thief.retrieve(q)
        assert thief.epsilon_spent == 0.0 and own.epsilon_spent > 0
        # nothing was charged to the victims; the operator's audit names the reason
        assert all(f.gateway.principal_spent(lbl) == 0.0 for lbl in labels[1:])
        unissued = [a for a in f.audit if a.principal == "unissued"]
        assert len(unissued) == 2 * len(forged) + 1 and all(a.reasons == ("unissued_principal",) for a in unissued)
        # re-attach needs the capability, not the label
        with pytest.raises(ValueError, match="issued"):
            f.connect(labels[0])
        token = own.principal.capability
        spent = own.epsilon_spent
    # durable: a restarted federation knows the capability (and its spend), not the label
    with Federation(FCFG, data, accountant=Accountant("rdp", store=DurableStore(tmp_path / "fed.sqlite"), name="fed"),
                    rng=np.random.default_rng(3)) as f2:
        again = f2.connect(token)
        assert str(again.principal) == labels[0] and again.epsilon_spent == pytest.approx(spent)
        with pytest.raises(SupportPrivacyViolation):
            again.retrieve(q)                                                       # its budget is still spent
        assert str(f2.connect().principal) not in labels


def test_gate_serves_only_what_a_user_may_do(tmp_path, data, ray_local):
    """In-cluster agents hold a FederationGate, never the service: no operator method exists on it."""
    from fedmem.agent.federation_service import (REFUSED, RemoteMemoryClient, start_federation_gate,
                                                 start_federation_service)

    ray = ray_local
    svc = start_federation_service(FCFG, data, tmp_path / "federation.sqlite", seed=1)
    gate = start_federation_gate(svc)
    try:
        assert os.stat(tmp_path / "federation.sqlite").st_mode & 0o077 == 0          # owner only
        for name in ("audit", "ground_truth_many", "spent_of", "close", "stats", "public_info"):
            with pytest.raises(AttributeError):
                getattr(gate, name)
        info = ray.get(gate.info.remote())
        assert "ledger_path" not in info
        mine = RemoteMemoryClient(gate, ray.get(gate.connect.remote()))
        other = ray.get(gate.connect.remote())
        q = np.random.default_rng(2).normal(size=FCFG.key_dim)
        mine.retrieve(q)
        assert mine.epsilon_spent > 0 and len(mine.bookings()) == 1
        assert ray.get(gate.principal_spent.remote(str(mine.principal))) == 0.0       # a label reads nothing
        assert ray.get(gate.bookings.remote(str(mine.principal))) == []
        for forged in (str(other), "p1", None, 12):
            out = ray.get(gate.retrieve.remote(forged, q))
            assert isinstance(out, tuple) and out[0] == REFUSED and isinstance(out[1], int)
    finally:
        ray.kill(gate, no_restart=True)
        ray.kill(svc, no_restart=True)


class ProbeAgent(AgentClient):
    """A hostile agent: on ``spend()`` it runs the issue's probes from inside its own process."""

    def spend(self):
        out = super().spend()
        out["probe"] = probe(self)
        return out


def _attempt(fn):
    try:
        v = fn()
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": type(exc).__name__}
    return {"ok": True, "value": v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)[:200]}


def probe(agent) -> dict:
    """The boundary attacks, as an agent's code would try them (plain values only)."""
    import socket
    import sqlite3

    root = Path(agent.ledger.store.path).parents[1]
    info = json.loads((root / "probe.json").read_text())
    out = {"uid": os.getuid(), "ray_env": sorted(k for k in os.environ if k.startswith("RAY"))}

    def ray_actors():
        import ray
        from ray._private import state

        if not ray.is_initialized():
            raise RuntimeError("no Ray here")
        return len(state.actors())

    out["ray_actors"] = _attempt(ray_actors)

    def gcs_tcp():
        host, port = info["gcs"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=3):
            return True

    out["gcs_tcp"] = _attempt(gcs_tcp)

    def raylet_socket():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect(info["raylet_socket"])
        s.close()
        return True

    out["raylet_socket"] = _attempt(raylet_socket)
    out["raylet_fds"] = _attempt(lambda: len(os.listdir(f"/proc/{info['raylet_pid']}/fd")))
    out["read_fed_ledger"] = _attempt(lambda: len(open(info["fed_path"], "rb").read(16)))

    def edit_fed_ledger():
        con = sqlite3.connect(info["fed_path"])
        con.execute("DELETE FROM accountant_events")
        con.commit()
        return True

    out["edit_fed_ledger"] = _attempt(edit_fed_ledger)
    other = [u for u in info["ledgers"] if u != agent.user][0]
    out["read_other_ledger"] = _attempt(lambda: len(open(info["ledgers"][other], "rb").read(16)))
    out["signal_other_agent"] = _attempt(lambda: os.kill(info["pids"][other], 0))

    def import_unlisted():
        """Agent code importing modules the zygote did not (not in PRELOAD), after the uid drop."""
        import importlib
        import importlib.machinery
        import sys

        from fedmem.agent.isolated import PRELOAD

        names = ("colorsys", "json.tool", "netrc")
        fresh = all(n not in sys.modules and n not in PRELOAD for n in names)
        plain = importlib.machinery.PathFinder.find_spec("colorsys") is not None   # the interpreter's own finder
        # companion: the same kind of import with the fallback taken out
        fallback = [f for f in sys.meta_path if type(f).__name__ == "_DirFdFinder"]
        for f in fallback:
            sys.meta_path.remove(f)
        try:
            importlib.import_module("netrc")
            without = "imported"
        except ImportError:
            without = "refused"
        finally:
            sys.meta_path.extend(fallback)
        ok = (importlib.import_module("colorsys").rgb_to_hsv(1, 0, 0) == (0.0, 1.0, 1.0)
              and callable(importlib.import_module("json.tool").main))
        return f"fresh={fresh} plain_finder={plain} without_fallback={without} imported={ok}"

    out["import_unlisted"] = _attempt(import_unlisted)
    fed = agent.federation
    rpc = getattr(fed, "_rpc", None) or getattr(fed, "_service", None)
    q = np.ones(FCFG.key_dim)

    def call(name, *args):
        if hasattr(rpc, "call"):
            return rpc.call(name, *args)
        import ray

        from fedmem.agent.federation_service import REFUSED
        from fedmem.federation.gateway import refusal

        out = ray.get(getattr(rpc, name).remote(*args), timeout=60)
        if isinstance(out, tuple) and out and out[0] == REFUSED:
            raise refusal(out[1])                      # what RemoteMemoryClient does with it
        return out

    for name, args in (("audit", ()), ("ground_truth_many", (q[None],)), ("spent_of", (info["labels"][other],)),
                       ("info", ())):
        out[f"operator_{name}"] = _attempt(lambda name=name, args=args: call(name, *args))
    forged = {"other_label": info["labels"][other], "guessed_next": "p3", "random": "0" * 32}
    for k, cap in forged.items():
        out[f"forge_{k}"] = _attempt(lambda cap=cap: call("retrieve", cap, q, None, None))
        out[f"spent_{k}"] = _attempt(lambda cap=cap: call("spent", cap) if hasattr(rpc, "call")
                                     else call("principal_spent", cap))
    return out


def _write_probe_info(sess, tmp, ray):
    from ray._private import worker

    node = worker._global_node
    info = {"gcs": ray.get_runtime_context().gcs_address, "raylet_socket": node.raylet_socket_name,
            "raylet_pid": next(p.process.pid for p in node.all_processes["raylet"]) if "raylet" in node.all_processes
            else os.getpid(),
            "fed_path": str(sess.fed_path), "ledgers": {u: str(p) for u, p in sess.ledger_paths.items()},
            "labels": dict(sess.principals),
            "pids": sess.agent_pids() if hasattr(sess, "agent_pids") else sess.call("pid")}
    (tmp / "probe.json").write_text(json.dumps(info))
    os.chmod(tmp / "probe.json", 0o644)


@pytest.fixture(scope="module")
def codec():
    from fedmem.agent.dpmind import load_minilm

    return load_minilm()[1]


@pytest.fixture(scope="module")
def projector(ray_local):
    """One nearest-token search service for the module's sessions (it loads the MiniLM index once)."""
    from fedmem.agent.federation_service import start_projector_service

    h = start_projector_service()
    yield h
    ray_local.kill(h, no_restart=True)


def test_same_probe_from_an_in_cluster_agent_sees_the_cluster(tmp_path, data, codec, projector, ray_local):
    """Companion: the in-cluster mode only simulates the boundary. The same probe, run from a
    Ray actor, lists the cluster's actors (so the isolated test above could have failed)."""
    from fedmem.agent.session import open_session
    from fedmem.experiments.agent_worlds import make_world

    import sys

    import ray.cloudpickle

    ray = ray_local
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])       # ProbeAgent into the Ray workers
    worlds = make_world(2, 1, data, np.random.default_rng(1), codec=codec, context_tokens=128)
    with open_session("cluster", worlds, FCFG, data, ACFG, tmp_path, seed=3, projector=projector,
                      agent_cls=ProbeAgent) as s:
        s.run()
        _write_probe_info(s, tmp_path, ray)
        spend = s.call("spend")
        for sp in spend.values():
            p = sp["probe"]
            assert p["ray_actors"]["ok"] and p["ray_actors"]["value"] >= 5                 # the whole cluster
            assert p["gcs_tcp"]["ok"]                                                       # GCS reachable
            # the gate still narrows the API: no operator method, forged capabilities refused
            assert not p["operator_audit"]["ok"] and not p["forge_other_label"]["ok"]


def test_what_an_agent_sends_is_never_unpickled_freely():
    """The session decodes an agent's frames with an allow-list: a pickle that would run
    code (``os.system``) is refused; the results it must carry (StepResult, arrays) pass."""
    import pickle

    from fedmem.agent.client import StepResult
    from fedmem.agent.isolated import _dumps, _loads_untrusted

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    for bad in (Evil(), Principal("p-00", "secret"), np.random.default_rng(0)):
        with pytest.raises(pickle.UnpicklingError, match="not allowed"):
            _loads_untrusted(pickle.dumps(bad))
    r = StepResult(task=1, federation={"query_id": 3, "value": np.arange(3.0), "event": {"k": 1.0}, "channels": ("value",)},
                   federation_refused=False, brace=np.ones(2), memview_views=(("s", "v", False),), app_text="t",
                   dpmind_transcript=[{"role": "user", "content": "x"}], dpmind_tokens=5, answer="a", dp_answer="b",
                   correct=True)
    back = _loads_untrusted(_dumps((r, np.float64(0.5), {"x": np.int64(2)})))
    assert back[0].task == 1 and np.array_equal(back[0].federation["value"], np.arange(3.0)) and back[1] == 0.5


# ---- one isolated session shared by the two tests below (last in the module: its processes live only while they run)
@pytest.fixture(scope="module")
def isolated_run(data, codec, projector, ray_local):
    """ONE isolated session (one zygote, one federation service) for the module: two hostile
    probe agents (2 tasks each) and two agents whose OS process is SIGKILLed mid-task 1, after
    its context reached the external model: a correct one and a late-booking one (3 tasks each)."""
    import shutil
    import tempfile
    import threading

    from fedmem.agent.session import open_session
    from fedmem.experiments.agent_worlds import make_world

    out = Path(tempfile.mkdtemp(prefix="fedmem-iso-", dir="/tmp"))   # the agents' uids must reach it
    os.chmod(out, 0o711)                                                # (pytest's base temp is 0700)
    worlds = make_world(4, 3, data, np.random.default_rng(1), codec=codec, context_tokens=128)
    worlds = [dataclasses.replace(w, tasks=w.tasks[:2]) for w in worlds[:2]] + worlds[2:]
    probes, killed = [w.user for w in worlds[:2]], (worlds[2].user, worlds[3].user)
    cls = {probes[0]: ProbeAgent, probes[1]: ProbeAgent, killed[0]: SlowAfterRelease, killed[1]: LateBooking}
    try:
        with open_session("isolated", worlds, FCFG, data, ACFG, out, seed=3, projector=projector,
                          agent_cls=cls) as s:
            s.submit()
            got: dict = {}
            th = threading.Thread(target=lambda: got.update(results=s.gather()), daemon=True)
            th.start()
            flags = {u: s.ledger_paths[u].with_suffix(".released") for u in killed}
            deadline = time.monotonic() + 300
            for u, flag in flags.items():
                while not flag.exists():
                    assert time.monotonic() < deadline, f"agent {u} never reached task 1"
                    time.sleep(0.05)
                s.kill_agent(u)                                 # SIGKILL mid-task 1: the step never returns
            th.join(timeout=300)
            assert not th.is_alive(), "the session did not notice the killed agents"
            yield {"session": s, "out": out, "worlds": worlds, "results": got["results"], "probes": probes,
                   "killed": killed, "flags": flags}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_isolated_agent_reaches_nothing_but_its_rpc(isolated_run, ray_local):
    ray = ray_local
    s, results, probes = isolated_run["session"], isolated_run["results"], isolated_run["probes"]
    assert set(s.dead) == set(isolated_run["killed"]) and not s.failed     # only the two killed on purpose
    assert all(len(results[u]) == 2 for u in probes)
    assert s.enforced["own_process_outside_ray"]
    assert s.enforced["own_uid"] == s.enforced["network_namespace"] == ROOT
    _write_probe_info(s, isolated_run["out"], ray)
    checks = s.call("check", 7)
    assert set(checks) == set(probes)
    assert all(c == {"federation": [], "memview": [], "brace": [], "dpmind": []} for c in checks.values())
    spend = s.call("spend")
    audit = ray.get(s.fed.audit.remote())
    assert not s.failed, s.failed
    for u in probes:
        sp = spend[u]
        admitted = sum(1 for a in audit if a.principal == s.principals[u] and a.decision.startswith("admitted"))
        assert sp["federation"]["releases"] == admitted == 2
        p = sp["probe"]
        assert p["ray_env"] == [] and not p["ray_actors"]["ok"]                  # no Ray in the agent
        for k in ("operator_audit", "operator_ground_truth_many", "operator_spent_of", "operator_info",
                  "forge_other_label", "forge_guessed_next", "forge_random"):
            assert not p[k]["ok"], (k, p[k])
        assert p["spent_other_label"] == {"ok": True, "value": 0.0}               # reads nothing of another
        assert p["forge_other_label"]["error"] == "SupportPrivacyViolation"
        # a module missing from the zygote's PRELOAD does not break the agent: as root, the agent's
        # uid cannot read the interpreter's files by path (plain_finder=False; with the fallback
        # taken out the import is refused, so this check can fail) and the fallback imports it
        without = "refused" if ROOT else "imported"
        assert p["import_unlisted"] == {"ok": True, "value": f"fresh=True plain_finder={not ROOT} "
                                                             f"without_fallback={without} imported=True"}, p
        if ROOT:        # OS-enforced: other uid, empty network namespace, file permissions
            assert p["uid"] >= 200000
            for k in ("gcs_tcp", "raylet_socket", "raylet_fds", "read_fed_ledger", "edit_fed_ledger",
                      "read_other_ledger", "signal_other_agent"):
                assert not p[k]["ok"], (k, p[k])
        assert s.reopen_ledger(u).summary() == {k: v for k, v in sp.items() if k != "probe"}
    assert ray.get(s.fed.stats.remote())["calls"] >= 4
    assert len(s.reopen_ledger(probes[0]).federation_bookings()) == 2   # the federation ledger is intact



def test_killed_isolated_agent_loses_no_booked_charge(isolated_run, ray_local):
    """SIGKILL of an isolated agent's OS process mid-task 1, after its context reached the external
    model: every channel that left is booked on disk for the correct agent; the late-booking agent
    (context sent before its booking) is caught by the same test; the other agents went on."""
    ray = ray_local
    s, res = isolated_run["session"], isolated_run["results"]
    good, broken = isolated_run["killed"]
    assert all([r.task for r in res[u]] == [0, 1] for u in isolated_run["probes"])
    audit = ray.get(s.fed.audit.remote())
    problems = {}
    for u in (good, broken):
        assert s.dead[u]["task"] == 1 and sorted(s.dead[u]["lost_tasks"]) == [1, 2], s.dead[u]
        assert [r.task for r in res[u]] == [0]
        feds = sum(1 for a in audit if a.principal == s.principals[u] and a.decision.startswith("admitted"))
        released = int(isolated_run["flags"][u].read_text())
        assert released == 2 and feds == 2 and ray.get(s.external.count.remote(u)) > 0
        problems[u] = lost_charges(s.reopen_ledger(u), released, feds)
    assert problems[good] == []
    assert problems[broken] and problems[broken][0].startswith("dpmind"), problems


def test_frame_bounds_refuse_oversized_and_slow_frames():
    """An announced size above max_frame is refused before any body byte is read; a frame trickled
    a byte at a time dies at its deadline; the budget caps bytes buffered at once. Companions: the
    same frames pass with the bound lifted (no max / no deadline / a budget large enough)."""
    import socket
    import struct
    import threading

    from fedmem.agent.isolated.wire import AgentDied, FrameBudget, recv_bytes

    a, b = socket.socketpair()
    a.sendall(struct.pack(">I", 64 << 20))
    with pytest.raises(AgentDied, match="exceeds"):
        recv_bytes(b, max_frame=1 << 20)
    a.close(), b.close()

    def trickle(sock, body, gap):
        sock.sendall(struct.pack(">I", len(body)))
        for ch in body:
            time.sleep(gap)
            sock.sendall(bytes([ch]))

    for deadline, ok in ((0.3, False), (None, True)):
        a, b = socket.socketpair()
        t = threading.Thread(target=trickle, args=(a, b"abcdefgh", 0.1), daemon=True)
        t.start()
        if ok:
            assert recv_bytes(b, deadline_s=deadline) == b"abcdefgh"
        else:
            with pytest.raises(AgentDied, match="deadline"):
                recv_bytes(b, deadline_s=deadline)
        t.join()
        a.close(), b.close()
    for total, ok in ((1000, False), (1 << 20, True)):
        a, b = socket.socketpair()
        a.sendall(struct.pack(">I", 4096) + b"x" * 4096)
        budget = FrameBudget(total)
        if ok:
            assert len(recv_bytes(b, budget=budget, deadline_s=1.0)) == 4096 and budget.used == 0
        else:
            with pytest.raises(AgentDied, match="budget"):
                recv_bytes(b, budget=budget, deadline_s=0.2)
        a.close(), b.close()
