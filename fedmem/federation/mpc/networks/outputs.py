"""What the parties open: the secure sum (blocked Beaver matmul), count and per-shard tallies of a
selection mask, and their decoding.
"""

from __future__ import annotations

import numpy as np

from fedmem.federation.sharing import SelectionSpec, decode

# torch, and rounds (which imports it), are imported inside the functions that run in a party: shard
# hosts import fedmem.federation.mpc with numpy only (tests/test_lazy_imports.py; torch is ~12 s of
# `python -X importtime` on this 2-core machine).


SUM_BLOCK = 1 << 23
"""Most value elements (B x candidates x d) in one Beaver product of the secure sum (64 MB
of int64); beyond it the sum runs in blocks of candidates, one round per block."""


def open_outputs(R, mask, vals, B: int, S: int, m: int, spec: SelectionSpec) -> dict:
    """Secure sum (one matmul round), count and tallies (linear), opened in one round."""
    from fedmem.federation.mpc.rounds import mul  # lazy: loads torch (~2.5 s)

    opened, names = [], []
    if "sum" in spec.reveal:
        # scale 1 x scale 2^16: the exact ring sum of the selected encoded values. Large inputs
        # go in blocks of candidates, one round each (a public function of the shapes), so that
        # the Beaver triple and the opened masks never hold more than SUM_BLOCK elements.
        N, d = vals.shape[1], vals.shape[2]
        step = max(1, SUM_BLOCK // max(1, B * d))
        total = None
        for lo in range(0, N, step):
            part = R.drive(mul("matmul", mask[:, None, lo:lo + step], vals[:, lo:lo + step])).squeeze(1)
            total = part if total is None else total + part
        opened.append(total)
        names.append("sum")
    for name, x in support_outputs(mask, B, S, m, spec):
        opened.append(x)
        names.append(name)
    return decode_opened(names, R.round([("open", x) for x in opened]) if opened else [])


def support_outputs(mask, B: int, S: int, m: int, spec: SelectionSpec) -> list[tuple[str, object]]:
    """Count and per-shard tallies of the selection: linear in the mask's shares (no communication);
    ``mask`` is raw share tensors or a CrypTen ``MPCTensor``."""
    out = []
    if "count" in spec.reveal:
        out.append(("count", mask.sum(1)))
    if "tallies" in spec.reveal:
        out.append(("tallies", mask.view(B, S, m).sum(2)))
    return out


def decode_opened(names, plain) -> dict:
    """Opened ring elements by name: the sum decoded from fixed point, count and tallies as integers."""
    out = {}
    for name, x in zip(names, plain):
        arr = x.numpy().astype(np.int64)
        out[name] = decode(arr) if name == "sum" else arr
    return out
