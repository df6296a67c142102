"""``FederationConfig``: every knob of one federation, declared once.

Each field is a :func:`fedmem.params.knob` (type, default, bounds, help). The same
declaration validates the Python API (``ValueError`` naming the field and the value),
builds the ``[federation]`` section of scenario files (:func:`fedmem.params.schema_of`)
and is printed by ``fedmem show``; cross-field rules live in
:meth:`FederationConfig.problems`, used by both. Importing this module is cheap (no
numpy, dp-accounting, Ray or CrypTen), so scenario validation stays fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedmem.params import at_least, between, check_knobs, knob, open_unit, positive

SELECTIONS = ("topk", "threshold", "broadcast")
NOISES = ("gaussian", "laplace")
CALIBRATIONS = ("global", "realized")
RECEIPTS = ("expose", "suppress", "noised", "broadcast")
MPCS = ("crypten", "plaintext")
MPC_IMPLS = ("auto", "rank", "grouped", "merge")   # fedmem.federation.mpc.networks.IMPLS without the naive baseline
ON_REJECT = ("raise", "rerun_broadcast")
_BUDGETS = ("epsilon_budget", "total_epsilon_budget", "support_budget_bits", "total_support_budget_bits")


RING_SUM_LIMIT = 2.0**46
"""Largest public bound ``N * clip`` on a coordinate of the selected values' sum (``N`` the most
values a selection can pick): encoded with 16 fractional bits it stays below ``2^62``, half of the
64-bit ring's signed range, so the parties' ring sum can never wrap (``fedmem.federation.sharing``)."""


def _grid_limit(scale: float) -> float:
    """``2^52 g`` for the secure sampler's default grid ``g`` of a public ``scale``
    (``fedmem.dp.samplers.grid_granularity``, rewritten here so that importing this module stays
    cheap): the largest ``|value|`` it releases exactly."""
    return math.ldexp(1.0, math.floor(math.log2(scale)) - 20 + 52)


def _range_problems(c, selection: str, cap: int) -> list[tuple[str, str]]:
    """The booked sensitivity holds only if the exact sum fits the fixed-point ring and the secure
    sampler's range for EVERY dataset: checked on the public bound ``N * clip`` (``N``: k for top-k,
    shards*k_local otherwise), so no release can fail, wrap or be refused because of the records."""
    out = []
    n = c.k if selection == "topk" else cap
    bound = n * c.clip
    if not bound < RING_SUM_LIMIT:
        out.append(("clip", f"clip * {n} (the most values one selection sums: "
                            f"{'k' if selection == 'topk' else 'shards * k_local'}) must stay below 2**46 = "
                            f"{RING_SUM_LIMIT:g}, so that the fixed-point ring sum (64-bit, 16 fractional bits) "
                            f"cannot wrap; found clip={c.clip!r}, {n} values"))
    if c.sampling == "secure":
        sens = 2.0 * c.clip * (1.0 if c.noise == "gaussian" else math.sqrt(c.value_dim))
        scale = c.sigma * sens / (c.n_bound if c.calibration == "global" else 1.0)
        # realized: the sum S itself (|S| <= N C per coordinate); global: the mean S / D, at most C when D is
        # the exact or the public count, up to N C with a noised count (D >= 1)
        top = bound if (c.calibration == "realized" or c.receipts == "noised") else c.clip
        if not top < _grid_limit(scale):
            out.append(("sigma", f"the secure sampler releases |value| < {_grid_limit(scale):g} exactly at "
                                 f"noise scale {scale:g} (sigma={c.sigma!r}, clip={c.clip!r}"
                                 + (f", n_bound={c.n_bound!r}" if c.calibration == "global" else "")
                                 + f"), below the public bound {top:g} on the sum; raise sigma or lower clip"))
        if c.receipts == "noised" and not c.k_local < _grid_limit(c.receipt_sigma * math.sqrt(2.0)):
            out.append(("receipt_sigma", f"the secure sampler cannot release tallies up to k_local={c.k_local} "
                                         f"at receipt_sigma={c.receipt_sigma!r}; raise receipt_sigma"))
    return out


@dataclass(frozen=True)
class FederationConfig:
    """Every knob of one federation (validated at construction; ``ValueError`` names the field).

    The defaults are a **defended** federation: top-k selection (public count), noise
    calibrated to the realized denominator, no receipts, the gateway on, and budgets per
    principal and in total. Every undefended setting (``gateway=False``, exposed receipts,
    global calibration, ``math.inf`` budgets) must be asked for explicitly.
    """

    shards: int = knob(40, "number of memory shards", check=positive)
    records_per_shard: int = knob(50, "records on each shard", check=positive)
    key_dim: int = knob(128, "key embedding dimension", check=positive)
    value_dim: int = knob(128, "value vector dimension (the released aggregate)", check=positive)
    clip: float = knob(1.0, "value vectors are clipped to this L2 norm C", check=positive)
    k_local: int = knob(5, "k': candidates each shard sends, padded to exactly k'", check=positive)
    selection: str = knob("topk", "global selection rule (it decides the support)", choices=SELECTIONS)
    k: int = knob(5, "global k of topk selection", check=positive)
    threshold: float = knob(0.5, "score threshold of threshold selection (cosine)", check=between(-1.0, 1.0))
    parties: int = knob(2, "MPC compute parties (2 or 3 with crypten)", check=at_least(2))
    mpc: str = knob("crypten", "MPC backend: crypten (real secret sharing) or plaintext (bit-identical "
                    "reference)", choices=MPCS)
    mpc_impl: str = knob("auto", "top-k protocol of the CrypTen parties: auto (a cost model fitted on one "
                         "machine, docs/federation-mpc.md; scripts/bench_engine.py --fit-impl measures yours), "
                         "rank, grouped or merge (same output, different speed)", choices=MPC_IMPLS)
    noise: str = knob("gaussian", "central DP noise on the aggregate", choices=NOISES)
    sigma: float = knob(1.2, "noise multiplier (noise std = sigma * sensitivity)", check=positive)
    delta: float = knob(1e-6, "delta of the accountant and of every Gaussian release", check=open_unit)
    calibration: str = knob("realized", "realized: noise calibrated to the denominator applied; global: noise "
                            "sized for n_bound (papers/003's flawed practice; refused with the gateway on and a "
                            "data-dependent count)", choices=CALIBRATIONS)
    n_bound: int = knob(40, "contributor count assumed by global calibration", check=positive)
    receipts: str = knob("suppress", "receipt (per-shard tally) policy", choices=RECEIPTS)
    receipt_sigma: float = knob(1.0, "noise multiplier of noised tallies", check=positive)
    gateway: bool = knob(True, "run the support-leak gateway (papers/003 Decision Boundary); false = undefended")
    on_reject: str = knob("raise", "gateway: refuse, or answer by the support-safe broadcast when the primary "
                          "release cannot be admitted", choices=ON_REJECT)
    support_budget_bits: float = knob(1.0, "support-channel bits allowed per principal (inf disables)",
                                      check=positive, allow_inf=True)
    total_support_budget_bits: float = knob(4.0, "support-channel bits allowed over all principals (inf "
                                            "disables)", check=positive, allow_inf=True)
    epsilon_budget: float = knob(10.0, "epsilon (at delta) allowed per principal (inf disables)", check=positive,
                                 allow_inf=True)
    total_epsilon_budget: float = knob(100.0, "epsilon (at delta) allowed over all principals (inf disables)",
                                       check=positive, allow_inf=True)
    sampling: str = knob("secure", "noise sampler (fast: float samplers, not DP as released)",
                          choices=("fast", "secure"))
    timeout_s: float = knob(30.0, "timeout of every remote call", check=positive)
    hosts: int = knob(2, "shard-host Ray actors (shards are split among them)", check=positive)
    max_batch: int = knob(1024, "most queries per retrieve_many call", check=positive)

    def __post_init__(self):
        check_knobs(self)
        problems = self.problems(self)
        if problems:
            raise ValueError("; ".join(f"{key}: {msg}" for key, msg in problems))

    @staticmethod
    def problems(c) -> list[tuple[str, str]]:
        """Cross-field problems of a configuration (this class, or a scenario's ``[federation]``
        section, which reports them with file and key). Each knob alone is already valid."""
        out = []
        if c.mpc == "crypten" and c.parties > 3:
            out.append(("parties", f"must be 2 or 3 with mpc='crypten', found {c.parties}"))
        if c.mpc_impl != "auto" and c.mpc != "crypten":
            out.append(("mpc_impl", f"chooses the CrypTen parties' protocol; it needs mpc='crypten', found "
                                    f"mpc={c.mpc!r} with mpc_impl={c.mpc_impl!r}"))
        if c.k_local > c.records_per_shard:
            out.append(("k_local", f"k_local={c.k_local} exceeds records_per_shard={c.records_per_shard}"))
        cap = c.shards * c.k_local
        if c.k > cap:
            out.append(("k", f"k={c.k} is larger than the candidates sent, shards*k_local={cap}"))
        if c.calibration == "global" and c.n_bound > cap:
            out.append(("n_bound", f"n_bound={c.n_bound} exceeds the most contributors possible, "
                                   f"shards*k_local={cap}"))
        if c.hosts > c.shards:
            out.append(("hosts", f"hosts={c.hosts} exceeds shards={c.shards}"))
        selection = "broadcast" if c.receipts == "broadcast" else c.selection
        out += _range_problems(c, selection, cap)
        if c.gateway and c.calibration == "global" and selection == "threshold":
            out.append(("calibration",
                        "calibration='global' cannot be defended with selection='threshold' (found gateway=True): "
                        "the noise is sized for n_bound but the number of selected records is data-dependent, so "
                        "the delivered privacy loss depends on the exact count. Admitting only queries whose count "
                        "is close to n_bound would make the refusal itself a leak (it reveals |n - n_bound|). Use "
                        "calibration='realized' (noise calibrated to the denominator actually applied), "
                        "selection='topk' or 'broadcast' (public count), or gateway=False to demonstrate the leak "
                        "undefended."))
        return out

    @property
    def effective_selection(self) -> str:
        """``receipts="broadcast"`` forces the broadcast selection (constant tallies need it)."""
        return "broadcast" if self.receipts == "broadcast" else self.selection

    @property
    def budgets(self) -> dict:
        return {name: getattr(self, name) for name in _BUDGETS}
