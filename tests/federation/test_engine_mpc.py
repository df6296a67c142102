"""The federation engine's use of the MPC layer (fedmem.federation.engine): parties get refs
owned by the hosts, unfetchable or tampered host output fails closed, MPC cost is public.

Moved from tests/test_mpc.py (the MPC layer's tests, split along module lines).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedmem.federation.mpc import PlaintextParties
from fedmem.federation.parties import Parties
from fedmem.federation.shard_host import INLINE_SEALED_BYTES
from fedmem.federation.sharing import SelectionSpec
from tests.federation.mpc.helpers import dead_refs as _dead_refs


# ----------------------------------------------------------------------------- engine: refs and MPC cost

def _engine_cfg(**kw):
    import math

    from fedmem.federation.engine import FederationConfig

    base = dict(shards=8, records_per_shard=10, key_dim=8, value_dim=4, k_local=2, hosts=2, mpc="crypten",
                n_bound=8, timeout_s=60.0, gateway=False, receipts="expose", calibration="global",
                epsilon_budget=math.inf, total_epsilon_budget=math.inf, support_budget_bits=math.inf,
                total_support_budget_bits=math.inf)
    base.update(kw)
    return FederationConfig(**base)


@pytest.fixture(scope="module")
def small_data():
    from fedmem.bench.shards import make_clustered_shards

    return make_clustered_shards(8, 10, 8, 4, 1.0, np.random.default_rng(31), clusters=4)


def _fetch(ray_mod, item):
    """A packet item as a party gets it: an ObjectRef is fetched, a sealed packet returned by value is itself."""
    return ray_mod.get(item) if isinstance(item, ray_mod.ObjectRef) else item


def test_engine_hands_parties_refs_owned_by_the_hosts(small_data, ray_local, crypten_parties):
    """The driver relays ObjectRefs only; the hosts own them (their death makes them unfetchable)."""
    from fedmem.bench.shards import sample_queries
    from fedmem.dp import Accountant
    from fedmem.federation.engine import Federation

    q = sample_queries(small_data, 2, np.random.default_rng(32))
    with Federation(_engine_cfg(selection="topk", k=3), small_data, accountant=Accountant(),
                    rng=np.random.default_rng(33), parties=crypten_parties) as f:
        packets = f.engine.packets(f.engine.queries(q), "topk")
        assert len(packets) == 2 and all(len(p) == 2 for p in packets)
        assert all(isinstance(x, ray_local.ObjectRef) for p in packets for x in p)
        got = crypten_parties.run(packets, SelectionSpec("topk", k=3))
        truth = f.ground_truth_many(q)
        np.testing.assert_array_equal(got.tallies, np.stack([t.tallies for t in truth]))
        from ray.core.generated.common_pb2 import Address

        owners = [[Address.FromString(x.owner_address()).worker_id.hex() for x in p] for p in packets]
        hosts = [w["worker_id"] for w in ray_local.get([h.where.remote() for h in f.hosts])]
        assert owners == [hosts, hosts]   # put by the hosts; the driver only borrowed the refs


def test_unfetchable_host_output_fails_the_query_closed(small_data, ray_local, crypten_parties):
    """A host's packet cannot be fetched by a party: FederationFault, nothing booked, hosts healed."""
    from fedmem.bench.shards import sample_queries
    from fedmem.dp import Accountant
    from fedmem.errors import FederationFault
    from fedmem.federation.engine import Federation, Response

    q = sample_queries(small_data, 2, np.random.default_rng(34))

    class LoseOnePacket(Parties):
        n_parties = 2

        def __init__(self):
            self.calls = 0

        @property
        def public_keys(self):
            return crypten_parties.public_keys

        def run(self, packets, spec, *, run_id=None, impl="auto"):
            self.calls += 1
            if self.calls == 1:
                packets = [list(p) for p in packets]
                packets[1][1] = _dead_refs(ray_local, [[None]])[0][0]
            return crypten_parties.run(packets, spec, run_id=run_id, impl=impl)

        def close(self):
            return None

    acc = Accountant()
    with Federation(_engine_cfg(selection="topk", k=3), small_data, accountant=acc,
                    rng=np.random.default_rng(35), parties=LoseOnePacket()) as f:
        with pytest.raises(FederationFault, match="nothing was released or booked"):
            f.retrieve(q[0])
        assert acc.count == 0 and [a.decision for a in f.audit] == ["fault"]
        assert isinstance(f.retrieve(q[0]), Response) and acc.count > 0


def test_mpc_rounds_and_bytes_are_public_and_carried(small_data, ray_local, crypten_parties):
    """Rounds/bytes reach Response and audit, and are identical on neighbouring datasets."""
    from fedmem.bench.shards import sample_queries, with_record
    from fedmem.dp import Accountant
    from fedmem.federation.engine import Federation

    q = sample_queries(small_data, 3, np.random.default_rng(36))
    rng = np.random.default_rng(37)
    key = q[0] / np.linalg.norm(q[0])       # a record that the first query will surely select
    neighbour = with_record(small_data, 3, key, rng.uniform(-0.3, 0.3, 4))
    for kw in (dict(selection="topk", k=3), dict(selection="threshold", threshold=0.3),
               dict(selection="broadcast")):
        seen = []
        for data in (small_data, neighbour):
            with Federation(_engine_cfg(**kw), data, accountant=Accountant(), rng=np.random.default_rng(38),
                            parties=crypten_parties) as f:
                rs = f.retrieve_many(q)
                one = f.retrieve(q[1])
                costs = [(r.mpc_rounds, r.mpc_bytes, r.mpc_batch) for r in rs] + [
                    (one.mpc_rounds, one.mpc_bytes, one.mpc_batch)]
                assert [(a.mpc_rounds, a.mpc_bytes, a.mpc_batch) for a in f.audit] == costs
                seen.append((costs, [t.sum.tolist() for t in f.ground_truth_many(q)]))
        (c0, rec0), (c1, rec1) = seen
        assert c0 == c1, kw                       # public: same cost whatever the records
        assert c0[0][0] > 0 and c0[0][1] > 0 and c0[0][2] == 3 and c0[-1][2] == 1
        assert rec0 != rec1, kw                   # the neighbour really changed what was selected
    with Federation(_engine_cfg(mpc="plaintext", selection="topk", k=3), small_data, accountant=Accountant(),
                    rng=np.random.default_rng(38)) as f:
        r = f.retrieve(q[0])
        assert (r.mpc_rounds, r.mpc_bytes, r.mpc_batch) == (None, None, None)


def test_engine_object_store_holds_only_ciphertext(small_data, ray_local):
    """What the hosts hand out (put in the object store, or returned by value when small) are
    SealedPackets: an observer that fetches them (as any code in the cluster, or the driver, can)
    finds no share bytes; answers equal the ground truth; a
    packet replaced in the store fails the query closed with nothing booked."""
    import dataclasses
    import pickle

    from fedmem.bench.shards import sample_queries
    from fedmem.dp import Accountant
    from fedmem.errors import FederationFault
    from fedmem.federation.engine import Federation, Response
    from fedmem.federation.sharing import SealedPacket

    q = sample_queries(small_data, 3, np.random.default_rng(94))

    class Spy(PlaintextParties):
        def __init__(self):
            super().__init__(2)
            self.seen, self.tamper = [], False

        def run(self, packets, spec, *, run_id=None, impl="auto"):
            self.seen.append((packets, run_id))
            if self.tamper:
                packets = [list(p) for p in packets]
                s = _fetch(ray_local, packets[0][0])
                ct = bytearray(s.ciphertext)
                ct[-1] ^= 1
                packets[0][0] = ray_local.put(dataclasses.replace(s, ciphertext=bytes(ct)))
            return super().run(packets, spec, run_id=run_id, impl=impl)

    spy, acc = Spy(), Accountant()
    with Federation(_engine_cfg(mpc="plaintext", selection="topk", k=3), small_data, accountant=acc,
                    rng=np.random.default_rng(95), parties=spy) as f:
        rs = f.retrieve_many(q)
        truth = f.ground_truth_many(q)
        for r, t in zip(rs, truth):
            np.testing.assert_array_equal(r.receipts, t.tallies)
        packets, rid = spy.seen[-1]
        assert rid is not None and len(rid) == 16
        for p, row in enumerate(packets):
            for ref in row:
                s = _fetch(ray_local, ref)          # what anyone reading the object store (or the driver) gets
                assert isinstance(s, SealedPacket) and s.party == p and s.run_id == rid
                plain = spy._keys[p].open(s, rid, p)
                body = b"".join(np.ascontiguousarray(a).tobytes() for a in (plain.scores, plain.values, plain.valid))
                blob = pickle.dumps(s)
                assert not any(body[i:i + 16] in blob for i in range(0, len(body) - 16, 16))
        n_booked = acc.count
        spy.tamper = True
        with pytest.raises(FederationFault, match="nothing was released or booked"):
            f.retrieve(q[0])
        assert acc.count == n_booked and f.audit[-1].decision == "fault"
        spy.tamper = False
        assert isinstance(f.retrieve(q[0]), Response)


def test_engine_with_three_parties_sends_two_seeds_and_one_share_packet(small_data, ray_local):
    """Seed-compressed shares with n = 3 through the engine: every host stores two sealed seed packets (48
    bytes of ciphertext each) and one sealed share packet; the parties' outputs equal the ground truth."""
    from fedmem.bench.shards import sample_queries
    from fedmem.dp import Accountant
    from fedmem.federation.engine import Federation
    from fedmem.federation.sharing import SelectionSpec, new_run_id

    q = sample_queries(small_data, 4, np.random.default_rng(96))
    cfg = _engine_cfg(mpc="plaintext", parties=3, selection="topk", k=3)
    with Federation(cfg, small_data, accountant=Accountant(), rng=np.random.default_rng(97)) as f:
        uq, keys, rid = f.engine.queries(q), f.parties.public_keys, new_run_id()
        packets = f.engine.packets(uq, "topk", keys, rid)
        sealed = [[_fetch(ray_local, ref) for ref in row] for row in packets]
        assert [{s.kind for s in row} for row in sealed] == [{"seed"}, {"seed"}, {"shares"}]
        assert all(s.ciphertext.nbytes == 48 for row in sealed[:2] for s in row)
        # small sealed packets come back by value (ciphertext), larger ones as refs the hosts put:
        # B = 4 (all small) and B = 256 (the share packets exceed the bound), both answered exactly
        kinds = set()
        for qq in (q, sample_queries(small_data, 256, np.random.default_rng(98))):
            rid2 = new_run_id()
            items = f.engine.packets(f.engine.queries(qq), "topk", keys, rid2)
            for row in items:
                for item in row:
                    s = _fetch(ray_local, item)
                    ref = isinstance(item, ray_local.ObjectRef)
                    assert ref == (s.ciphertext.nbytes > INLINE_SEALED_BYTES)
                    kinds.add((ref, s.kind))
            got = f.parties.run(items, SelectionSpec("topk", k=3), run_id=rid2)
            np.testing.assert_array_equal(got.tallies, np.stack([t.tallies for t in f.ground_truth_many(qq)]))
        assert kinds == {(False, "seed"), (False, "shares"), (True, "shares")}
        got = f.parties.run(packets, SelectionSpec("topk", k=3), run_id=rid)
        truth = f.ground_truth_many(q)
        np.testing.assert_array_equal(got.sum, np.stack([t.sum for t in truth]))
        np.testing.assert_array_equal(got.tallies, np.stack([t.tallies for t in truth]))


def test_mpc_impl_knob_picks_the_parties_protocol_and_keeps_the_output(ray_local, crypten_parties):
    """``FederationConfig.mpc_impl`` reaches the CrypTen parties: rank, grouped and merge run different
    protocols (different public rounds and bytes) with the same answers (equal to the ground truth), and
    ``auto`` runs what ``choose_impl`` picks for the batch's shapes."""
    from fedmem.bench.shards import make_clustered_shards, sample_queries
    from fedmem.dp import Accountant
    from fedmem.federation.engine import Federation
    from fedmem.federation.mpc.networks import choose_impl, grouped_plan

    data = make_clustered_shards(16, 10, 8, 4, 1.0, np.random.default_rng(101), clusters=4)   # grouped beats rank here
    assert grouped_plan(16, 2, 3) is not None
    q = sample_queries(data, 3, np.random.default_rng(99))
    rounds, answers = {}, {}
    for impl in ("rank", "grouped", "merge", "auto"):
        with Federation(_engine_cfg(shards=16, selection="topk", k=3, mpc_impl=impl), data, accountant=Accountant(),
                        rng=np.random.default_rng(100), parties=crypten_parties) as f:
            rs = f.retrieve_many(q)
            truth = f.ground_truth_many(q)
            for r, t in zip(rs, truth):
                np.testing.assert_array_equal(r.receipts, t.tallies)
            rounds[impl] = (rs[0].mpc_rounds, rs[0].mpc_bytes)
            answers[impl] = np.stack([r.receipts for r in rs])
    assert len({rounds["rank"], rounds["grouped"], rounds["merge"]}) == 3, rounds
    pick = choose_impl(3, 16, 2, 3, False)
    assert rounds["auto"] == rounds[pick], (rounds, pick)
    assert all(np.array_equal(answers["rank"], a) for a in answers.values())
