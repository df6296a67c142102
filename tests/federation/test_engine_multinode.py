"""A real multi-node run: head + 2 worker raylets on this machine (``ray.cluster_utils.Cluster``).

The cluster lives in a **subprocess** (``python tests/federation/test_engine_multinode.py``) so that the
session's private Ray (``ray_local`` in conftest.py) is neither joined nor disturbed;
the subprocess starts its own head and workers and tears them down (it stops only what
it started). ``RAY_TMPDIR`` points the subprocess at a temp dir of its own: ``Cluster``
records its head in ``<temp>/ray/ray_current_cluster``, which under the default ``/tmp``
would make any bare ``ray.init()`` on the machine join (or, once the cluster is gone, fail
on) this test's cluster, and would collide with a ``ray start`` of another test or user.
What it checks:

* the compute parties sit on distinct nodes (``STRICT_SPREAD``), rendezvous on rank 0's
  node IP, and the shard hosts are spread over several nodes;
* every host generates its own shards from a ``ShardRecipe`` (no record passes through
  the driver), the driver relays only ObjectRefs (owned by the hosts), and the secure
  result is bit-identical to the plaintext reference on the same shares and to the
  ground truth;
* removing a node (its raylet, object store, host and party) mid-query fails closed:
  ``FederationFault``, nothing booked, audit ``fault``; the federation then recovers on
  the remaining nodes and answers correctly again.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

MARK = "MULTINODE-RESULT "


def _scenario() -> dict:
    import threading

    import numpy as np
    import ray
    from ray.cluster_utils import Cluster

    from fedmem.bench.shards import ShardRecipe, sample_queries
    from fedmem.dp import Accountant
    from fedmem.errors import FederationFault
    from fedmem.federation.engine import Federation, FederationConfig, Response
    from fedmem.federation.mpc import CryptenParties, PlaintextParties
    from fedmem.federation.sharing import SelectionSpec

    out: dict = {"timings": {}}
    t0 = time.perf_counter()
    from fedmem._ray import QUIET_AGENT_ENV, lean_private_head

    fast_health = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                   "health_check_failure_threshold": 4}
    # each node as lean as fedmem's private instance (no log monitor, a quiet dashboard agent; the head
    # without the autoscaler monitor and the dashboard head: lean_private_head); nothing here reads them
    small = {"num_cpus": 1, "object_store_memory": 96 * 1024 * 1024, "include_log_monitor": False,
             "env_vars": dict(QUIET_AGENT_ENV)}
    with lean_private_head():
        cluster = Cluster(initialize_head=True, head_node_args={**small, "include_dashboard": False,
                                                                "_system_config": fast_health})
        workers = [cluster.add_node(**small) for _ in range(2)]
    try:
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        head_id = ray.get_runtime_context().get_node_id()
        out["nodes"] = sum(1 for n in ray.nodes() if n["Alive"])
        out["address_recorded_in_own_tmpdir"] = os.path.exists(
            os.path.join(os.environ.get("RAY_TMPDIR", "/nonexistent"), "ray", "ray_current_cluster"))
        out["timings"]["cluster_s"] = time.perf_counter() - t0

        S, N, KD, VD = 12, 10, 8, 4
        data = ShardRecipe(shards=S, records_per_shard=N, key_dim=KD, value_dim=VD, seed=41, clusters=4)
        q = sample_queries(data, 4, np.random.default_rng(42))   # each host generates its own shards
        cfg = FederationConfig(shards=S, records_per_shard=N, key_dim=KD, value_dim=VD, k_local=2, hosts=3,
                               selection="topk", k=4, n_bound=S, timeout_s=30.0, gateway=False,
                               receipts="expose", calibration="global", epsilon_budget=math.inf,
                               total_epsilon_budget=math.inf, support_budget_bits=math.inf,
                               total_support_budget_bits=math.inf)
        t1 = time.perf_counter()
        cp = CryptenParties(2, timeout_s=30.0, start_timeout_s=120.0, placement="spread")
        out["timings"]["parties_start_s"] = time.perf_counter() - t1
        acc = Accountant()
        f = Federation(cfg, data, accountant=acc, rng=np.random.default_rng(43), parties=cp)
        try:
            party_nodes = [n["node_id"] for n in cp.nodes]
            hosts = ray.get([h.where.remote() for h in f.hosts])
            out["strategy"] = cp.strategy
            out["party_nodes_distinct"] = len(set(party_nodes)) == 2
            out["host_nodes"] = len({h["node_id"] for h in hosts})
            out["rendezvous_ip_is_rank0_node_ip"] = cp.rendezvous.startswith(f"tcp://{cp.nodes[0]['ip']}:")

            # -- bit-identical to the plaintext reference, on shares the driver never holds
            qq = f.engine.queries(q)
            packets = f.engine.packets(qq, "topk")
            out["driver_holds_refs_only"] = all(isinstance(x, ray.ObjectRef) for p in packets for x in p)
            spec = f.policy.selection_spec()
            got = cp.run(packets, spec)
            want = PlaintextParties(2).run(packets, spec)
            truth = f.ground_truth_many(q)
            out["bit_identical"] = bool(
                np.array_equal(got.sum, want.sum) and np.array_equal(got.count, want.count)
                and np.array_equal(got.tallies, want.tallies)
                and np.array_equal(got.sum, np.stack([t.sum for t in truth]))
                and np.array_equal(got.tallies, np.stack([t.tallies for t in truth])))
            rs = f.retrieve_many(q)
            out["responses_match_truth"] = all(np.array_equal(r.receipts, t.tallies) for r, t in zip(rs, truth))
            out["mpc_rounds"], out["mpc_bytes"] = rs[0].mpc_rounds, rs[0].mpc_bytes
            booked = acc.count

            # -- remove a worker node that holds a host (and a party, when SPREAD put a host there)
            # while a query waits on that host
            host_nodes = {h["node_id"] for h in hosts}
            candidates = [n for n in party_nodes if n != head_id and n in host_nodes] or [
                w.node_id for w in workers if w.node_id in host_nodes]
            victim_node = candidates[0]
            out["victim_holds_party"] = victim_node in party_nodes
            victim = next(w for w in workers if w.node_id == victim_node)
            stalled = next(i for i, h in enumerate(hosts) if h["node_id"] == victim_node)
            f.hosts[stalled].stall.remote(60.0)
            outcome: dict = {}

            def query():
                try:
                    outcome["r"] = f.retrieve(q[0])
                except Exception as exc:  # noqa: BLE001 - inspected below
                    outcome["e"] = exc

            th = threading.Thread(target=query)
            t2 = time.perf_counter()
            th.start()
            time.sleep(1.0)
            cluster.remove_node(victim, allow_graceful=False)
            th.join(timeout=45)
            out["timings"]["fault_s"] = time.perf_counter() - t2
            out["fault_failed_closed"] = (not th.is_alive() and isinstance(outcome.get("e"), FederationFault)
                                          and "r" not in outcome and acc.count == booked
                                          and f.audit[-1].decision == "fault")
            out["fault_message"] = str(outcome.get("e"))[:300]

            # -- recovery on the remaining nodes (the dead party is noticed and replaced on a later call)
            t3 = time.perf_counter()
            recovered, errors = None, []
            for _ in range(3):
                try:
                    recovered = f.retrieve(q[0])
                    break
                except FederationFault as exc:
                    errors.append(str(exc)[:200])
            out["timings"]["recover_s"] = time.perf_counter() - t3
            out["recovery_faults_booked_nothing"] = acc.count == booked + (1 if recovered is not None else 0)
            out["recovered"] = isinstance(recovered, Response) and bool(
                np.array_equal(recovered.receipts, f.ground_truth(q[0]).tallies))
            out["recovery_errors"] = errors
            out["party_nodes_after"] = len({n["node_id"] for n in cp.nodes})
        finally:
            f.close()
            cp.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    out["timings"]["total_s"] = time.perf_counter() - t0
    return out


@pytest.mark.slow   # its own 3-node cluster in a subprocess
def test_multinode_cluster_places_apart_matches_plaintext_and_fails_closed():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = "0"
    # short: Ray's session sockets live under it (AF_UNIX paths are limited to 107 bytes)
    env["RAY_TMPDIR"] = tmp = tempfile.mkdtemp(prefix="fm-mn-", dir="/tmp")
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__)], capture_output=True, text=True,
                              timeout=170, env=env, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"multi-node scenario did not finish in time: {str(exc.stderr)[-2000:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    assert proc.returncode == 0 and lines, (proc.stdout[-2000:], proc.stderr[-4000:])
    res = json.loads(lines[-1][len(MARK):])
    assert res["address_recorded_in_own_tmpdir"], res     # not in /tmp/ray, where other Ray users look
    assert res["nodes"] == 3 and res["strategy"] == "STRICT_SPREAD", res
    assert res["party_nodes_distinct"] and res["host_nodes"] >= 2 and res["rendezvous_ip_is_rank0_node_ip"], res
    assert res["driver_holds_refs_only"] and res["bit_identical"] and res["responses_match_truth"], res
    assert res["mpc_rounds"] > 0 and res["mpc_bytes"] > 0, res
    assert res["fault_failed_closed"], res
    assert res["recovered"] and res["recovery_faults_booked_nothing"] and res["party_nodes_after"] == 2, res
    if res["victim_holds_party"]:   # the dead party is noticed on the next call (fails closed), then replaced
        assert len(res["recovery_errors"]) == 1 and "compute parties failed" in res["recovery_errors"][0], res


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    print(MARK + json.dumps(_scenario()), flush=True)
