"""The int8 certified cascade (matmul="int8") and the exact tie resolution shared by every path."""

import numpy as np
import pytest

from fedmem.agent.dpmind.cascade import CascadeProjector, int8_available
from fedmem.agent.dpmind.embeddings import TokenTable
from fedmem.dp import MetricLaplace

pytestmark = pytest.mark.skipif(not int8_available(), reason="torch without oneDNN int8 linear")


def _tie_table():
    rng = np.random.default_rng(3)
    m = rng.normal(0.0, 0.06, (500, 384)).astype(np.float32)
    m[20] = m[10]                       # an exact duplicate: the lower id must win
    m[40] = m[30]
    m[40, 0] = -m[30, 0]                # differs from row 30 only in the sign of coordinate 0
    return TokenTable("ties", tuple(f"t{i}" for i in range(500)), m, frozenset())


def _tie_points(table):
    x1 = table.matrix[10].copy()
    x1[5] += np.float32(1e-3)
    x2 = table.matrix[30].copy()
    x2[0] = np.float32(-(2.0 ** -100))  # s(40) - s(30) = -4 |E_30,0| 2^-100: row 40 wins, far below float64
    x3 = x2.copy()
    x3[0] = np.float32(2.0 ** -100)     # ... and row 30 here
    return np.stack([x1, x2, x3])


@pytest.mark.parametrize("matmul", ["int8", "float32"])
def test_adversarial_ties_follow_exact_arithmetic(matmul):
    table = _tie_table()
    proj = CascadeProjector(table, threads=1, matmul=matmul, block=2)
    pts = _tie_points(table)
    want = [10, 40, 30]
    np.testing.assert_array_equal(proj.exhaustive(pts), want)
    np.testing.assert_array_equal(proj.project(pts), want)
    assert proj.exact_ties >= 2


def test_float64_only_tie_break_is_caught():
    """Broken variant: the exact step replaced by float64's tie rule (lowest id among the columns
    float64 cannot separate): rows 30 and 40 tie in float64, so it answers 30; the test catches it."""
    table = _tie_table()
    proj = CascadeProjector(table, threads=1, matmul="int8")
    proj._exact_winner = lambda x, cols: int(proj._ids[cols].min())
    assert list(proj.project(_tie_points(table))) != [10, 40, 30]


@pytest.fixture(scope="module")
def minilm():
    from fedmem.agent.dpmind.embeddings import load_minilm

    return load_minilm()


@pytest.fixture(scope="module")
def minilm_points(minilm):
    table, _ = minilm
    rng = np.random.default_rng(5)
    ids = rng.choice(table.output_ids, 300)
    pts = (table.matrix[ids].astype(np.float64) + MetricLaplace(50.0, 384).sample(rng, 300)).astype(np.float32)
    return pts, CascadeProjector(table, threads=1, matmul="float32").exhaustive(pts)


def test_int8_cascade_equals_exhaustive_on_minilm(minilm, minilm_points):
    table, _ = minilm
    proj = CascadeProjector(table, threads=1, matmul="int8")
    pts, ref = minilm_points
    np.testing.assert_array_equal(proj.project(pts), ref)
    assert 0 < proj.fallbacks < proj.projected   # some queries kept more than one candidate


def test_int8_cascade_with_a_broken_bound_is_caught(minilm, minilm_points):
    """Broken variant: the error bound zeroed (and slightly negative) keeps only the int8 argmin."""
    table, _ = minilm
    proj = CascadeProjector(table, threads=1, matmul="int8")
    q = proj._int8
    q.de = q.de * 0.0
    q.ne = q.ne * 0.0
    q.max_de = q.max_ne = q.max_et = q.max_sq32 = 0.0
    q.dsq = -1e-6
    pts, ref = minilm_points
    assert np.mean(proj.project(pts) != ref) > 0.005
