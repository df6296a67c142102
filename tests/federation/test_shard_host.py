"""The shard hosts' local step (fedmem.federation.shard_host): top-k, padding, tie break, clip.

Moved from tests/test_shards.py (now tests/bench/test_shards.py).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fedmem.federation.shard_host import PAD_SCORE, local_candidates, split_shards, stack_shards


# ----------------------------------------------------------------- shard host local step
def test_local_topk_padding_tiebreak_and_clip():
    keys = [np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), np.array([[0.6, 0.8]])]
    values = [np.array([[3.0, 0.0], [0.0, 0.5], [0.1, 0.1]]), np.array([[0.2, 0.2]])]
    K, Vv, M = stack_shards(keys, values)
    q = np.array([[1.0, 0.0]])
    s, v, ok = local_candidates(q, K, Vv, M, k_local=2, clip=1.0, mode="topk")
    assert s.shape == (1, 2, 2) and v.shape == (1, 2, 2, 2)
    # shard 0: exact tie between records 0 and 1 -> lower index first; value of record 0 clipped to norm 1
    np.testing.assert_allclose(s[0, 0], [1.0, 1.0])
    np.testing.assert_allclose(v[0, 0, 0], [1.0, 0.0])
    np.testing.assert_allclose(v[0, 0, 1], [0.0, 0.5])
    # shard 1 has one record: padded to k'=2 with an invalid zero row at PAD_SCORE
    assert ok[0, 1].tolist() == [1, 0] and s[0, 1, 1] == PAD_SCORE and not v[0, 1, 1].any()
    _, vb, okb = local_candidates(q, K, Vv, M, k_local=2, clip=1.0, mode="broadcast")
    assert okb.all()  # broadcast: the padding row becomes a zero-value dummy flagged valid
    assert not vb[0, 1, 1].any()


def test_split_shards():
    parts = split_shards(10, 3)
    assert [len(p) for p in parts] == [4, 3, 3] and np.array_equal(np.concatenate(parts), np.arange(10))
    with pytest.raises(ValueError, match="hosts must be <= shards"):
        split_shards(2, 3)


def test_shard_host_module_does_not_import_torch():
    code = ("import sys, fedmem.federation.shard_host, fedmem.bench.shards, fedmem.federation; "
            "assert 'torch' not in sys.modules and 'crypten' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_encoded_candidates_equal_encoding_the_float_path():
    """The hosts' path (values clipped and encoded once per record, rows gathered as ring elements) gives
    exactly encode(local_candidates(...)) in every mode, with ragged shards, padding and rows to clip."""
    from fedmem.federation.sharing import encode
    from fedmem.federation.shard_host import encode_values, encoded_candidates

    rng = np.random.default_rng(5)
    keys, values = [], []
    for n in (7, 3, 1, 9):
        k = rng.normal(size=(n, 6))
        keys.append(k / np.linalg.norm(k, axis=1, keepdims=True))
        values.append(rng.normal(size=(n, 4)) * rng.choice([0.1, 3.0], size=(n, 1)))   # some rows over the clip
    K, Vv, M = stack_shards(keys, values)
    q = rng.normal(size=(5, 6))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    for mode in ("topk", "threshold", "broadcast"):
        s, v, ok = local_candidates(q, K, Vv, M, k_local=4, clip=1.0, mode=mode)
        es, ev, eok = encoded_candidates(q, K, encode_values(Vv, 1.0, rows=3), M, k_local=4, mode=mode)
        np.testing.assert_array_equal(es, encode(s))
        np.testing.assert_array_equal(ev, encode(v))
        np.testing.assert_array_equal(eok, ok)


def test_encoded_values_are_stored_small_when_they_fit():
    """encode_values keeps int32 when every encoding fits in it (the same integers), int64 otherwise."""
    from fedmem.federation.sharing import encode
    from fedmem.federation.shard_host import encode_values

    v = np.array([[[0.5, -0.25], [3.0, 4.0]]])
    small = encode_values(v, 1.0)
    assert small.dtype == np.int32
    np.testing.assert_array_equal(small, encode(np.array([[[0.5, -0.25], [0.6, 0.8]]])))
    big = encode_values(v * 1e5, 1e5)
    assert big.dtype == np.int64 and big.max() == encode(np.array(8e4))   # row [3e5, 4e5] clipped to norm 1e5
