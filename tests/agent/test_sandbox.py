"""Hostile agents that attack the sandbox itself (issue 38), in ONE isolated session: a daemon
forker, an agent whose step returns None, a ledger tamperer and a frame flooder beside an honest
agent. Each defence is asserted; the companions show each attack is real (the daemons did
start, the tampered row is there and is accepted once sealed, the flood's frame was sent)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from fedmem.agent.client import AgentConfig
from fedmem.agent.isolated.sandbox import Limits, pids_of_uid, sweep_uid
from fedmem.bench.shards import make_clustered_shards
from fedmem.federation.engine import FederationConfig
from tests.agent.agent_doubles import DaemonForker, FrameFlood, LedgerTamper, NoneResult

FCFG = FederationConfig(shards=6, records_per_shard=12, key_dim=16, value_dim=8, k=3, k_local=2, mpc="plaintext",
                        sigma=3.0, hosts=1, epsilon_budget=4.0, total_epsilon_budget=1000.0)
ACFG = AgentConfig(dpmind_chunk_tokens=128)
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
pytestmark = pytest.mark.skipif(not ROOT, reason="the sandbox (uids, cgroups, namespaces) needs root")


def _rss_mib(pid=None):
    with open(f"/proc/{pid or 'self'}/status") as fh:
        st = dict(line.split(":", 1) for line in fh)
    return int(st["VmRSS"].split()[0]) / 1024, int(st["Threads"])


def test_hostile_agents_fail_alone_and_leave_nothing(ray_local):
    from fedmem.agent.dpmind import load_minilm
    from fedmem.agent.session import open_session
    from fedmem.experiments.agent_worlds import make_world

    data = make_clustered_shards(FCFG.shards, FCFG.records_per_shard, FCFG.key_dim, FCFG.value_dim, FCFG.clip,
                                 np.random.default_rng(0), clusters=3)
    codec = load_minilm()[1]
    out = Path(tempfile.mkdtemp(prefix="fedmem-sbx-", dir="/tmp"))
    os.chmod(out, 0o711)
    worlds = make_world(5, 2, data, np.random.default_rng(2), codec=codec, context_tokens=128)
    honest, daemon, none, tamper, flood = (w.user for w in worlds)
    cls = {daemon: DaemonForker, none: NoneResult, tamper: LedgerTamper, flood: FrameFlood}
    rss0, threads0 = _rss_mib()
    try:
        with open_session("isolated", worlds, FCFG, data, ACFG, out, seed=5, agent_cls=cls, frame_deadline_s=5.0,
                          limits=Limits(pids=64)) as s:
            uids = dict(s.uids)
            assert len(set(uids.values())) == 5 and all(v >= 200000 for v in uids.values())
            res = s.run()
            rss1, threads1 = _rss_mib()
            print(f"flood: driver {rss0:.0f} -> {rss1:.0f} MiB, {threads0} -> {threads1} threads; "
                  f"limits {s.enforced['limits']}")
            # the flood: its oversized frame was refused before its body was read; only it died
            assert set(s.dead) == {flood} and "exceeds" in s.dead[flood]["error"], s.dead
            assert rss1 - rss0 < 256 and threads1 - threads0 < 100, (rss0, rss1, threads0, threads1)
            # the bad result fails only its agent
            assert [f["task"] for f in s.failed[none]] == [0, 1] and "malformed" in s.failed[none][0]["error"]
            assert [r.task for r in res[honest]] == [0, 1] and [r.task for r in res[tamper]] == [0, 1]
            # companion: the daemons are real and alive before close (more processes than the agent)
            assert len(pids_of_uid(uids[daemon])) > 10
            spend = s.call("spend")
            assert set(spend) == {honest, daemon, none, tamper}     # the failed steps did not take its spend away
            checks = s.call("check", 7)
            assert checks[honest] == {"federation": [], "memview": [], "brace": [], "dpmind": []}
            seal = s.verify_ledgers()
            assert seal[honest] == [] and seal[daemon] == []
            assert seal[tamper] and "never sealed" in seal[tamper][0]           # written outside a step
            # companion: sealing after the tamper (the defence removed) accepts the forged row
            s.seal.attest(tamper, s.ledger_paths[tamper], uids[tamper])
            assert s.seal.verify(tamper, s.ledger_paths[tamper], uids[tamper]) == []
        print(f"after close: survivors {s.survivors}")
        assert s.survivors == {}
        for u, uid in uids.items():
            assert pids_of_uid(uid) == [], u
    finally:
        for uid in locals().get("uids", {}).values():
            sweep_uid(uid)
        shutil.rmtree(out, ignore_errors=True)


def test_a_dead_federation_service_is_named(ray_local):
    """SIGKILL of the federation service: the next command that needs it raises FederationDied
    (one line naming the service), not an agent's error. Companion: before the kill, the same
    call returns every agent's spend."""
    from fedmem.agent.dpmind import load_minilm
    from fedmem.agent.isolated import FederationDied
    from fedmem.agent.session import open_session
    from fedmem.experiments.agent_worlds import make_world

    data = make_clustered_shards(FCFG.shards, FCFG.records_per_shard, FCFG.key_dim, FCFG.value_dim, FCFG.clip,
                                 np.random.default_rng(0), clusters=3)
    out = Path(tempfile.mkdtemp(prefix="fedmem-sbx-", dir="/tmp"))
    os.chmod(out, 0o711)
    worlds = make_world(2, 1, data, np.random.default_rng(3), codec=load_minilm()[1], context_tokens=128)
    try:
        with open_session("isolated", worlds, FCFG, data, ACFG, out, seed=6, timeout_s=60) as s:
            s.run()
            assert set(s.call("spend")) == {w.user for w in worlds}
            ray_local.kill(s.fed, no_restart=True)
            with pytest.raises(FederationDied, match="federation service died"):
                s.call("spend")
    finally:
        shutil.rmtree(out, ignore_errors=True)
