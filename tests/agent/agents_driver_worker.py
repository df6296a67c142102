"""Subprocess driver for tests/agent/test_actors.py (not a test module itself).

Usage: ``python agents_driver_worker.py OUT_DIR [GCS_ADDRESS PROJECTOR_NAME NAMESPACE]``.
Joins the Ray cluster at ``GCS_ADDRESS`` (the test session's; without it, starts its own
private Ray), runs an :class:`~fedmem.agent.session.ActorSession` (2 agents x 2 tasks)
against one federation service, using the named projector service when given, prints one
JSON line ``{"spend": {user: summary}, "principals": {...}}`` and then sleeps: the parent
SIGKILLs it there and reopens every ledger file (Ray kills this driver's actors when its
job dies).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from fedmem._ray import ensure_ray
from fedmem.agent.client import AgentConfig
from fedmem.agent.dpmind import load_minilm
from fedmem.agent.session import ActorSession
from fedmem.experiments.agent_worlds import make_world
from fedmem.bench.shards import make_clustered_shards
from fedmem.federation.engine import FederationConfig

FCFG = FederationConfig(shards=6, records_per_shard=12, key_dim=16, value_dim=8, k=3, k_local=2, mpc="plaintext",
                        sigma=3.0, hosts=1, total_epsilon_budget=1000.0)
ACFG = AgentConfig(dpmind_chunk_tokens=128)


def world():
    data = make_clustered_shards(FCFG.shards, FCFG.records_per_shard, FCFG.key_dim, FCFG.value_dim, FCFG.clip,
                                 np.random.default_rng(0), clusters=3)
    _, codec = load_minilm()
    return data, make_world(2, 2, data, np.random.default_rng(5), codec=codec, context_tokens=128)


def main(out_dir: str, address: str | None = None, projector: str | None = None,
         namespace: str | None = None) -> None:
    import ray

    data, worlds = world()
    if address:
        ensure_ray(address)
    else:
        ensure_ray(num_cpus=1)
    shared = ray.get_actor(projector, namespace=namespace) if projector else None
    sess = ActorSession(worlds, FCFG, data, ACFG, out_dir, seed=11, projectors=1, projector=shared)
    sess.run()
    spend = sess.call("spend")
    print(json.dumps({"spend": spend, "principals": sess.principals, "dead": sess.dead}), flush=True)
    while True:        # wait for SIGKILL: no close, no shutdown, no flush beyond what was booked
        time.sleep(1)


if __name__ == "__main__":
    main(*sys.argv[1:5])
