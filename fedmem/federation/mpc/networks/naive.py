"""The naive baseline (``impl="argmax"``, benchmark only): ``k`` sequential CrypTen argmaxes on
``MPCTensor``.
"""

from __future__ import annotations

from fedmem.federation.mpc.networks.outputs import decode_opened, support_outputs
from fedmem.federation.sharing import FRAC_BITS, MASK_FILL, SelectionSpec, encode

# CrypTen (and torch) are imported inside naive_program: shard hosts import fedmem.federation.mpc
# with numpy only (tests/test_lazy_imports.py; torch is ~12 s of `python -X importtime` here).


def naive_program(scores, values, valid, m: int, spec: SelectionSpec, rank: int) -> dict:
    """The naive baseline on CrypTen's ``MPCTensor``: ``k`` sequential argmaxes."""
    from fedmem._crypten import MPCTensor  # lazy: loads crypten, torch, onnx (~6.1 s)
    from crypten.mpc.primitives import ArithmeticSharedTensor

    B, N = scores.shape
    S = N // m
    val = MPCTensor.from_shares(valid, precision=0)
    shifted = scores.clone()
    if rank == 0:
        shifted += int(encode(MASK_FILL))
    eff = val * MPCTensor.from_shares(shifted, precision=FRAC_BITS)   # valid * (score + F)
    mask = naive_topk(eff, val, spec.k)
    opened, names = [], []
    if "sum" in spec.reveal:
        vals = MPCTensor.from_shares(values, precision=FRAC_BITS)
        opened.append(mask.unsqueeze(1).matmul(vals).squeeze(1))
        names.append("sum")
    for name, x in support_outputs(mask, B, S, m, spec):
        opened.append(x)
        names.append(name)
    plain = ArithmeticSharedTensor.reveal_batch([x._tensor for x in opened]) if opened else []
    return decode_opened(names, plain if isinstance(plain, (list, tuple)) else [plain])


def naive_topk(eff, val, k: int):
    """Baseline: ``k`` sequential CrypTen argmaxes (log-reduction), knocking out each winner.

    Benchmark only (``impl="argmax"``): CrypTen's argmax returns a random one-hot among
    exact ties, so this does not implement the documented tie-break.
    """
    mask = None
    cur = eff
    for _ in range(k):
        oh = cur.argmax(dim=1, one_hot=True)  # (B, N) one-hot, scale 1
        mask = oh if mask is None else mask + oh
        cur = cur - oh * cur  # winner's effective score -> 0 (below every valid one)
    return mask * val
