"""The secure program one CrypTen party runs on its shares (:func:`secure_program`): threshold,
broadcast or top-k by the chosen method, then the opened outputs.
"""

from __future__ import annotations

import numpy as np

from fedmem.federation.mpc.networks.cost_model import choose_impl, grouped_plan
from fedmem.federation.mpc.networks.naive import naive_program
from fedmem.federation.mpc.networks.outputs import open_outputs
from fedmem.federation.mpc.networks.selection import grouped_gen, merge_gen, rank_gen
from fedmem.federation.sharing import MASK_FILL, SCORE_BOUND, SelectionSpec, encode

# torch, and rounds (which imports it), are imported inside the functions that run in a party: shard
# hosts import fedmem.federation.mpc with numpy only (tests/test_lazy_imports.py; torch is ~12 s of
# `python -X importtime` on this 2-core machine).


PROVIDERS = ("TFP", "TTP")

IMPLS = ("auto", "rank", "grouped", "merge", "argmax")

FILL = int(encode(MASK_FILL)) + 1
"""Added to a valid row's encoded score: ``e = score + FILL * valid`` (linear, no
multiplication) puts every valid row (>= FILL - 2^36 > 2^36) above every invalid row
(|score| <= 2^36 encoded, ``SCORE_BOUND``), preserving the order and ties among valid rows."""


def secure_program(scores, values, valid, m: int, spec: SelectionSpec, rank: int, impl: str = "auto",
                   shards_sorted: bool = False):
    """Run inside ONE CrypTen party on that party's shares; returns the opened outputs.

    Every party executes exactly this code on its own shares (SPMD). Linear steps act on
    the local share tensors directly (public constants are added by party 0 only);
    comparisons and products run through :mod:`fedmem.federation.mpc.rounds` (CrypTen's
    communicator and triple provider, fused rounds), except the naive baseline
    (``impl="argmax"``), which runs on CrypTen's ``MPCTensor`` as a user would write it.
    """
    import torch

    from fedmem.federation.mpc import rounds as MR  # lazy: loads torch (~2.5 s)

    B, N = scores.shape
    S = N // m
    first = rank == 0

    def t(a):
        a = np.ascontiguousarray(a)
        if not a.flags.writeable:   # zero-copy from the object store: read-only, and never written here
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return torch.from_numpy(a)
        return torch.from_numpy(a)

    if spec.mode == "topk" and impl == "argmax" and N > spec.k:
        return naive_program(t(scores), t(values), t(valid), m, spec, rank)
    R = MR.Rounds()
    val = t(valid)   # raw 0/1 shares, scale 1
    if spec.mode == "broadcast":
        mask = val
    elif spec.mode == "threshold":
        d = t(scores).clone()
        if first:
            d -= int(encode(spec.threshold))
        # |score - threshold| <= 2 * 2^36 (SCORE_BOUND): 38 bits
        _, below_val = R.drive(R.ltz(d, MR.bits_for(2 * int(encode(SCORE_BOUND))), [(val, 0)]))
        mask = val - below_val    # valid and not below the threshold
    else:
        e = t(scores) + FILL * val
        if impl == "auto":
            impl = choose_impl(B, S, m, spec.k, shards_sorted)
        if N <= spec.k:
            mask = val
        elif impl == "merge":
            mask = R.drive(merge_gen(R, e, val, m, spec.k, first, shards_sorted))
        elif impl == "grouped" and grouped_plan(S, m, spec.k) is not None:
            mask = R.drive(grouped_gen(R, e, val, m, spec.k, first, grouped_plan(S, m, spec.k)))
        else:
            mask = R.drive(rank_gen(R, e, val, spec.k, first))
    return open_outputs(R, mask, t(values) if "sum" in spec.reveal else None, B, S, m, spec)
