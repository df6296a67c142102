"""Fixed-point encoding, additive sharing and sealed share packets (fedmem.federation.sharing).

Moved from tests/test_mpc.py (the MPC layer's tests, split along module lines).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedmem.federation.sharing import (
    FRAC_BITS, SelectionSpec, SharePacket, decode, encode, reconstruct, share, share_candidates,
)
from tests.federation.mpc.helpers import byte_uniformity_pvalue, make_candidates


# ----------------------------------------------------------------------------- encoding and sharing

def test_encode_decode_roundtrip_and_ring_wrap():
    x = np.array([0.0, 1.0, -1.0, 0.5, -3.25, 1e6, -1e6, 2.0**-16, 1 / 3])
    assert encode(x).dtype == np.int64
    np.testing.assert_array_equal(encode(x[:8]), np.rint(x[:8] * 2**FRAC_BITS).astype(np.int64))
    assert np.max(np.abs(decode(encode(x)) - x)) <= 2.0**-17
    # The ring wraps: shares of a negative number sum (mod 2^64) back to it.
    rng = np.random.default_rng(1)
    v = encode(np.array([-7.5, 3.0]))
    np.testing.assert_array_equal(reconstruct(share(v, 3, rng)), v)


@pytest.mark.parametrize("bad", [np.nan, np.inf, 2.0**48])
def test_encode_rejects_unencodable(bad):
    with pytest.raises(ValueError, match="x must"):
        encode(np.array([0.0, bad]))


@pytest.mark.parametrize("n", [2, 3])
def test_share_reconstructs_extremes(n):
    rng = np.random.default_rng(2)
    i64 = np.iinfo(np.int64)
    x = np.array([0, 1, -1, i64.max, i64.min, 123456789], dtype=np.int64)
    sh = share(x, n, rng)
    assert len(sh) == n and all(s.dtype == np.int64 for s in sh)
    np.testing.assert_array_equal(reconstruct(sh), x)


def test_single_party_shares_look_uniform_whatever_the_secret():
    """Any n-1 shares are uniform on Z_2^64: chi-square per byte, for two very different secrets."""
    rng = np.random.default_rng(3)
    for secret in (0, encode(np.array([0.731]))[0]):
        x = np.full(20000, secret, dtype=np.int64)
        for p, s in enumerate(share(x, 3, rng)):
            assert byte_uniformity_pvalue(s) > 1e-4, (secret, p)


def test_uniformity_check_catches_weak_masks():
    """Companion: shares masked with 32-bit randomness (a plausible bug) are caught."""
    rng = np.random.default_rng(4)
    x = np.zeros(20000, dtype=np.int64)
    weak = rng.integers(0, 2**32, size=x.shape, dtype=np.int64)
    assert byte_uniformity_pvalue(weak) < 1e-10
    assert byte_uniformity_pvalue(x - weak) < 1e-10


# (Shard hosts are numpy-only: that importing the sharing layer and mpc pulls no torch/CrypTen is
# checked in a fresh interpreter by tests/system/test_lazy_imports.py::test_fedmem_imports_no_heavy_module,
# the one subprocess for all import checks.)


def test_share_rejects_bad_input():
    rng = np.random.default_rng(5)
    with pytest.raises(ValueError, match="n_parties must be >= 2"):
        share(np.zeros(3, dtype=np.int64), 1, rng)
    with pytest.raises(TypeError, match="x_int must be an int64"):
        share(np.zeros(3), 2, rng)
    with pytest.raises(TypeError, match="rng must be"):
        share(np.zeros(3, dtype=np.int64), 2, 7)


def test_share_candidates_validates_and_packs():
    rng = np.random.default_rng(6)
    sc, vals, ok = rng.uniform(-1, 1, (4, 3)), rng.normal(size=(4, 3, 2)), np.ones((4, 3))
    pk = share_candidates(sc, vals, ok, np.array([7, 2, 9, 4]), 2, rng)  # single query: batch axis added
    assert len(pk) == 2 and pk[0].scores.shape == (1, 4, 3) and pk[0].values.shape == (1, 4, 3, 2)
    np.testing.assert_array_equal(reconstruct([p.valid for p in pk]), np.ones((1, 4, 3), dtype=np.int64))
    np.testing.assert_array_equal(reconstruct([p.scores for p in pk]), encode(sc[None]))
    with pytest.raises(ValueError, match="valid must hold only 0/1"):
        share_candidates(sc, vals, ok * 2, np.arange(4), 2, rng)
    with pytest.raises(ValueError, match=r"scores must satisfy \|score\|"):
        share_candidates(sc * 1e7, vals, ok, np.arange(4), 2, rng)
    with pytest.raises(ValueError, match="values must have shape"):
        share_candidates(sc, vals[:, :2], ok, np.arange(4), 2, rng)
    with pytest.raises(ValueError, match="shard_ids must be"):
        share_candidates(sc, vals, ok, np.arange(5), 2, rng)
    with pytest.raises(ValueError, match="shard_ids must be distinct"):
        SharePacket(pk[0].scores, pk[0].values, pk[0].valid, np.array([1, 1, 2, 3]))


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "best"}, "mode must be one of"),
    ({"mode": "topk", "k": 0}, "k must be >= 1"),
    ({"mode": "threshold", "threshold": float("nan")}, "threshold must be finite"),
    ({"mode": "topk", "reveal": frozenset({"sum", "ids"})}, "reveal must be a subset"),
])
def test_selection_spec_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SelectionSpec(**kwargs)
    with pytest.raises(TypeError, match="reveal must be a set"):
        SelectionSpec("topk", reveal="sum")


# ----------------------------------------------------------------------------- sealed share packets

def _sealed_fixture(rng, party=0):
    from fedmem.federation.sharing import PartyKey, new_run_id, seal_packet

    packets, _ = make_candidates(rng, 3, 6, 4, 5, n_hosts=1)
    key, rid = PartyKey(), new_run_id()
    return packets[party][0], key, rid, seal_packet(packets[party][0], key.public, rid, party)


def test_sealed_packet_opens_only_for_its_party_run_and_shards():
    """Round trip is exact; any other run, party, key, shard ids, shape, ephemeral key or byte is refused."""
    import dataclasses
    import pickle

    from fedmem.federation.sharing import PartyKey, new_run_id

    rng = np.random.default_rng(91)
    pk, key, rid, sealed = _sealed_fixture(rng)
    got = key.open(sealed, rid, 0)
    for f in ("scores", "values", "valid", "shard_ids"):
        np.testing.assert_array_equal(getattr(got, f), getattr(pk, f))
    body = b"".join(np.ascontiguousarray(a).tobytes() for a in (pk.scores, pk.values, pk.valid))
    blob = pickle.dumps(sealed)
    assert not any(body[i:i + 16] in blob for i in range(0, len(body) - 16, 16))   # no share bytes in the clear
    ct = bytearray(sealed.ciphertext)
    ct[len(ct) // 2] ^= 1
    bad = {
        "flipped ciphertext bit": (dataclasses.replace(sealed, ciphertext=bytes(ct)), rid, 0, key),
        "other run (replay)": (dataclasses.replace(sealed, run_id=new_run_id()), None, 0, key),
        "claims another run": (sealed, new_run_id(), 0, key),
        "other party": (dataclasses.replace(sealed, party=1), rid, 1, key),
        "other key": (sealed, rid, 0, PartyKey()),
        "swapped shard ids": (dataclasses.replace(sealed, shard_ids=sealed.shard_ids[::-1].copy()), rid, 0, key),
        "other shape": (dataclasses.replace(sealed, shape=(1, 18, 4, 5)), rid, 0, key),
        "other ephemeral key": (dataclasses.replace(sealed, epk=PartyKey().public), rid, 0, key),
        "plaintext packet": (pk, rid, 0, key),
        "other aead claimed": (dataclasses.replace(sealed, aead="chacha20-poly1305"), rid, 0, key),
    }
    for what, (s, r, p, k) in bad.items():
        with pytest.raises(ValueError, match="refused"):
            k.open(s, s.run_id if r is None and hasattr(s, "run_id") else r, p)
        assert what
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(key)
    from fedmem.federation.sharing import seal_packet

    cc = seal_packet(pk, key.public, rid, 0, aead="chacha20-poly1305")   # the AEAD without AES hardware
    np.testing.assert_array_equal(key.open(cc, rid, 0).values, pk.values)
    with pytest.raises(ValueError, match="refused"):
        key.open(dataclasses.replace(cc, aead="aes-256-gcm"), rid, 0)


# ----------------------------------------------------------------------------- seed-compressed shares

def test_seeded_shares_reconstruct_and_compress_to_a_seed():
    """share_candidates_seeded: n-1 SeedPackets (32 bytes each, expanded by AES-256-CTR) plus the difference;
    the shares reconstruct to the encodings, compress=False returns the same shares expanded, and a sealed
    seed packet opens to the expanded shares (its ciphertext is the seed and the tag: 48 bytes)."""
    from fedmem.federation.sharing import (PartyKey, SeedPacket, new_run_id, seal_packet, share_candidates_seeded)

    rng = np.random.default_rng(96)
    sc, vals = rng.uniform(-1, 1, (3, 4, 2)), rng.normal(size=(3, 4, 2, 5)) * 0.2
    ok = (rng.uniform(size=(3, 4, 2)) < 0.7).astype(np.int64)
    ids = np.array([3, 1, 7, 2])
    for n in (2, 3):
        pk = share_candidates_seeded(sc, vals, ok, ids, n, np.random.default_rng(97))
        assert [type(p) for p in pk] == [SeedPacket] * (n - 1) + [SharePacket]
        full = [p.expand() for p in pk[:-1]] + [pk[-1]]
        np.testing.assert_array_equal(reconstruct([p.scores for p in full]), encode(sc))
        np.testing.assert_array_equal(reconstruct([p.values for p in full]), encode(vals))
        np.testing.assert_array_equal(reconstruct([p.valid for p in full]), ok)
        same = share_candidates_seeded(sc, vals, ok, ids, n, np.random.default_rng(97), compress=False)
        for a, b in zip(full, same):
            for f in ("scores", "values", "valid", "shard_ids"):
                np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
        assert "seed=" not in repr(pk[0])    # the seed is as secret as the shares: never printed
    key, rid = PartyKey(), new_run_id()
    sealed = seal_packet(pk[0], key.public, rid, 0)
    assert sealed.kind == "seed" and sealed.ciphertext.nbytes == 32 + 16
    np.testing.assert_array_equal(key.open(sealed, rid, 0).values, full[0].values)
    import dataclasses

    with pytest.raises(ValueError, match="refused"):   # the kind is bound in the associated data
        key.open(dataclasses.replace(sealed, kind="shares"), rid, 0)
    with pytest.raises(ValueError, match="seed must be 32 bytes"):
        SeedPacket(b"short", (1, 1, 1, 1), ids[:1])


def test_seeded_shares_look_uniform_whatever_the_secret_and_reused_seeds_are_caught():
    """Every single share (a seed's keystream, or the difference) is uniform on Z_2^64 for two very
    different secrets (the byte chi-square of test_single_party_shares_look_uniform_whatever_the_secret);
    companion: the same check catches a seed whose keystream is reused for a second secret, since the
    difference of two last shares then reveals the difference of the secrets."""
    from fedmem.federation.sharing import share_encoded_seeded

    z = np.zeros((1, 1, 1), dtype=np.int64)
    lasts = []
    for secret in (0, encode(np.array([0.731]))[0]):
        v = np.full((1, 1, 1, 20000), secret, dtype=np.int64)
        pk = share_encoded_seeded(z, v, z, np.array([0]), 3, np.random.default_rng(98), compress=False)
        for p in pk:
            assert byte_uniformity_pvalue(p.values) > 1e-4, (secret, p)
        lasts.append(pk[-1].values)
    # the rng above was re-seeded identically for both secrets: the seeds repeat (the deliberate misuse)
    with np.errstate(over="ignore"):
        leak = lasts[0] - lasts[1]
    assert byte_uniformity_pvalue(leak) < 1e-10       # caught: constant, = secret1 - secret0
    fresh = share_encoded_seeded(z, np.full((1, 1, 1, 20000), 7, dtype=np.int64), z, np.array([0]), 2,
                                 np.random.default_rng(99))[-1].values
    with np.errstate(over="ignore"):
        assert byte_uniformity_pvalue(lasts[0] - fresh) > 1e-4   # fresh seeds: the difference is uniform


def test_prg_ring_is_the_aes_ctr_keystream():
    """prg_ring(seed, n): the first 8n bytes of AES-256-CTR(seed, zero counter block) over zeros, as
    little-endian int64 (a known-answer check against cryptography's own CTR from a separate zero buffer);
    a prefix of any longer stream of the same seed; other seeds give other streams; bad seeds are refused."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    from fedmem.federation.sharing import prg_ring

    seed = bytes(range(32))
    ref = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor().update(bytes(8 * 1001))
    np.testing.assert_array_equal(prg_ring(seed, 1001), np.frombuffer(ref, dtype="<i8"))
    np.testing.assert_array_equal(prg_ring(seed, 1001)[:7], prg_ring(seed, 7))
    assert not np.array_equal(prg_ring(seed, 64), prg_ring(bytes(32), 64))
    assert prg_ring(seed, 0).shape == (0,)
    with pytest.raises(ValueError, match="seed must be 32 bytes"):
        prg_ring(b"\0" * 16, 4)


def test_the_last_share_is_one_flat_body_sealed_without_a_copy():
    """share_encoded_seeded writes the last party's share as one flat buffer (scores, values, valid), which
    seal_packet encrypts as it is; a packet of separate arrays (or out of order) is concatenated first; both
    open to the same shares, and the shares still reconstruct the secret (n = 2 and 3)."""
    from fedmem.federation.sharing import (PartyKey, _flat_body, new_run_id, seal_packet, share_encoded_seeded)

    rng = np.random.default_rng(7)
    s, v = encode(rng.uniform(-1, 1, (3, 4, 2))), encode(rng.normal(size=(3, 4, 2, 5)))
    ok = (rng.uniform(size=(3, 4, 2)) < 0.6).astype(np.int64)
    for n in (2, 3):
        pk = share_encoded_seeded(s, v, ok, np.arange(4), n, np.random.default_rng(8), compress=False)
        last = pk[-1]
        body = _flat_body(last)
        assert body is not None and body.nbytes == 8 * (2 * 24 + 24 * 5)
        np.testing.assert_array_equal(reconstruct([p.values for p in pk]), v)
        np.testing.assert_array_equal(reconstruct([p.scores for p in pk]), s)
        np.testing.assert_array_equal(reconstruct([p.valid for p in pk]), ok)
        apart = SharePacket(scores=last.scores.copy(), values=last.values.copy(), valid=last.valid.copy(),
                            shard_ids=last.shard_ids)
        swapped = SharePacket(scores=last.valid, values=last.values, valid=last.scores, shard_ids=last.shard_ids)
        assert _flat_body(apart) is None and _flat_body(swapped) is None
        key, rid = PartyKey(), new_run_id()
        for p in (last, apart):
            got = key.open(seal_packet(p, key.public, rid, n - 1), rid, n - 1)
            for f in ("scores", "values", "valid"):
                np.testing.assert_array_equal(getattr(got, f), getattr(last, f))


def test_prg_words_at_reads_the_ctr_keystream_at_any_offset():
    """prg_words_at(seed, starts, n): rows of prg_ring at arbitrary (even and odd) word offsets, past the
    2^32-block boundary of a 32-bit counter too, and 0-length starts; bad arguments refused."""
    from fedmem.federation.sharing import prg_ring, prg_words_at

    seed = bytes(range(32))
    ring = prg_ring(seed, 4000)
    rng = np.random.default_rng(5)
    starts = np.concatenate([[0, 1, 2, 3], rng.integers(0, 3800, 60)])
    for n in (1, 2, 3, 128, 129):
        np.testing.assert_array_equal(prg_words_at(seed, starts, n), np.stack([ring[a:a + n] for a in starts]))
    # block 2^32 and on: the counter is the whole 128-bit block, not a 32-bit word (a direct CTR check)
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    far = 2 * (2**32 - 1) + 1      # odd word offset in the last block below 2^32: the row crosses into 2^32
    ref = Cipher(algorithms.AES(seed), modes.CTR((2**32 - 1).to_bytes(16, "big"))).encryptor().update(bytes(48))
    np.testing.assert_array_equal(prg_words_at(seed, [far], 5)[0], np.frombuffer(ref, dtype="<i8")[1:6])
    assert prg_words_at(seed, [], 4).shape == (0, 4)
    with pytest.raises(ValueError, match="starts must be non-negative"):
        prg_words_at(seed, [-1], 2)
    with pytest.raises(ValueError, match="seed must be 32 bytes"):
        prg_words_at(b"x", [0], 2)


def test_seed_shares_read_the_rows_an_expanded_seed_holds():
    """SeedPacket.rows(): scores and valid equal the expanded packet's and value_rows(b, s, c) equals its
    values[b, s, c] for random rows (odd and even d); a sealed seed opened with lazy=True gives the same; a
    SeedShares is refused where whole value arrays are needed (assemble(values=True)); the seed is never
    printed."""
    from fedmem.federation.mpc.layout import assemble
    from fedmem.federation.sharing import PartyKey, SeedPacket, SeedShares, new_run_id, seal_packet

    rng = np.random.default_rng(6)
    for shape in ((3, 4, 5, 7), (2, 3, 2, 128), (1, 1, 1, 1)):
        sp = SeedPacket(rng.bytes(32), shape, np.arange(shape[1]) + 10)
        full, lazy = sp.expand(), sp.rows()
        np.testing.assert_array_equal(lazy.scores, full.scores)
        np.testing.assert_array_equal(lazy.valid, full.valid)
        B, S, m, d = shape
        b, s, c = rng.integers(0, B, 40), rng.integers(0, S, 40), rng.integers(0, m, 40)
        np.testing.assert_array_equal(lazy.value_rows(b, s, c), full.values[b, s, c])
        np.testing.assert_array_equal(full.value_rows(b, s, c), full.values[b, s, c])
        assert lazy.value_rows(b[:0], s[:0], c[:0]).shape == (0, d)
        with pytest.raises(IndexError):
            lazy.value_rows([B], [0], [0])
    key, rid = PartyKey(), new_run_id()
    opened = key.open(seal_packet(sp, key.public, rid, 0), rid, 0, lazy=True)
    assert isinstance(opened, SeedShares) and "seed" not in repr(opened).replace("SeedShares", "")
    np.testing.assert_array_equal(opened.value_rows([0], [0], [0]), sp.expand().values[[0], [0], [0]])
    np.testing.assert_array_equal(assemble([opened], values=False)[0], full.scores.reshape(1, -1))
    with pytest.raises(TypeError, match="SharePacket"):
        assemble([opened])
