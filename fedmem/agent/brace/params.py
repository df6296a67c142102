"""BRACE public parameters and their Gaussian calibration (papers/001, Step 6, App. C.2).

:class:`BraceParams` is a frozen record of everything public about one BRACE release:
retrieval radius ``r = sqrt(2/beta)``, horizon ``T``, activation threshold ``kappa``
(Eq. (2)), the target ``(epsilon, delta)``, the dimension ``d`` and the smoothing
parameter ``gamma``. Building it checks Eq. (8); a ``gamma`` that violates Eq. (8) is
rejected (``ValueError``) instead of being clamped, because the privacy proof of
Appendix C.2 needs it. :meth:`BraceParams.event` is what the accountant books.

The per-step noise is ``N(0, T * Delta_bar_t^2 / (2 rho) I_d)`` with
``rho = (sqrt(log(1/delta) + epsilon) - sqrt(log(1/delta)))^2`` (Step 6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedmem import _validate as V
from fedmem.dp import ApproxDpEvent
from fedmem.params import REQUIRED, check_knobs, knob, open_unit, positive
from fedmem.dp import samplers


def rho_eps_delta(epsilon: float, delta: float) -> float:
    """``rho_{eps,delta} = (sqrt(log(1/delta) + eps) - sqrt(log(1/delta)))^2`` (Step 6).

    It is the zCDP parameter whose standard conversion gives exactly ``epsilon`` at
    ``delta``: ``epsilon = rho + 2 sqrt(rho log(1/delta))`` (App. C.2).
    """
    epsilon = V.positive("epsilon", epsilon)
    delta = V.open_unit("delta", delta)
    L = math.log(1.0 / delta)
    # Written as eps^2 / (sqrt(L+eps) + sqrt(L))^2 to avoid cancellation for small eps.
    return epsilon ** 2 / (math.sqrt(L + epsilon) + math.sqrt(L)) ** 2


def gamma_max(epsilon: float, delta: float, T: int, d: int) -> float:
    """Largest smoothing parameter allowed by Eq. (8) of papers/001 (App. C.2).

    With ``alpha = 1 + sqrt(log(1/delta) / rho)``::

        gamma <= min{1/4, 1/(8 (alpha - 1))}
        gamma <= (alpha log alpha - (alpha-1) log(alpha-1)) / ((alpha-1) {8 alpha (alpha-1) rho + 5 T d})

    Raises ``ValueError`` when no positive gamma exists (numerically: the bound is not a
    positive finite number).
    """
    T = V.positive_int("T", T)
    d = V.positive_int("d", d)
    rho = rho_eps_delta(epsilon, delta)
    L = math.log(1.0 / delta)
    am1 = math.sqrt(L / rho)  # alpha - 1
    alpha = 1.0 + am1
    first = min(0.25, 1.0 / (8.0 * am1))
    num = alpha * math.log(alpha) - am1 * math.log(am1)
    den = am1 * (8.0 * alpha * am1 * rho + 5.0 * T * d)
    second = num / den
    g = min(first, second)
    if not (math.isfinite(g) and g > 0):
        raise ValueError(
            f"no smoothing parameter gamma satisfies Eq. (8) for epsilon={epsilon!r}, delta={delta!r}, "
            f"T={T!r}, d={d!r}. Found bound {g!r}."
        )
    return g


GAMMA_MODES = ("eq8", "paper_0.25")
PAPER_GAMMA_MODE = "paper_0.25"
PAPER_GAMMA = 0.25
NOT_DP_LABEL = "violates Eq. (8): not a DP guarantee"


@dataclass(frozen=True)
class BraceParams:
    """Public parameters of one BRACE trajectory release.

    ``gamma=None`` takes the largest value allowed by Eq. (8) (:func:`gamma_max`); an
    explicit ``gamma`` above it raises ``ValueError``.

    ``gamma_mode="paper_0.25"`` is a *comparison setting only*: it fixes the paper's
    ``gamma = 0.25`` (App. G.1), which violates Eq. (8) at the paper's settings, so the
    release is **not** (epsilon, delta)-DP (:data:`NOT_DP_LABEL`). :attr:`dp_guarantee` is
    False, :meth:`event` raises ``ValueError`` and :class:`BraceMemory` refuses such params. ``r`` is the LSR radius; build
    from an inverse temperature with :meth:`from_beta` (``r = sqrt(2/beta)``).
    """

    r: float = knob(REQUIRED, "LSR radius r = sqrt(2/beta) (paper Sec. 6.1: 0.8, beta = 3.125)", type=float,
                    check=positive)
    T: int = knob(REQUIRED, "retrieval horizon", type=int, check=positive)
    epsilon: float = knob(REQUIRED, "privacy epsilon of the whole trajectory (paper Sec. 6.1: 128)", type=float,
                          check=positive)
    delta: float = knob(REQUIRED, "privacy delta (paper: 1e-5)", type=float, check=open_unit)
    d: int = knob(REQUIRED, "dimension of the memories", type=int, check=positive)
    kappa: float = knob(128.0, "activation threshold kappa (Eq. (2)); Sec. 6.1's instance activates at ||R_2|| = "
                        "0.125 (kappa < 0.0049 at r = 0.8, T = 5); Sec. 6.2 uses 128", check=positive)
    gamma: float | None = None
    gamma_mode: str = knob("eq8", "'eq8': gamma from Eq. (8) (DP); 'paper_0.25': the paper's gamma = 0.25 "
                           "(violates Eq. (8): not a DP guarantee; comparison only)", choices=GAMMA_MODES)

    def __post_init__(self):
        check_knobs(self)
        if self.gamma_mode == PAPER_GAMMA_MODE:
            if self.gamma is not None and self.gamma != PAPER_GAMMA:
                raise ValueError(f"gamma_mode={PAPER_GAMMA_MODE!r} fixes gamma = {PAPER_GAMMA}. Found gamma={self.gamma!r}.")
            object.__setattr__(self, "gamma", PAPER_GAMMA)
            return
        bound = gamma_max(self.epsilon, self.delta, self.T, self.d)
        if self.gamma is None:
            object.__setattr__(self, "gamma", bound)
        else:
            g = V.positive("gamma", self.gamma)
            if g > bound:
                raise ValueError(
                    f"gamma must satisfy Eq. (8) of papers/001, i.e. gamma <= {bound:.6g} for "
                    f"epsilon={self.epsilon!r}, delta={self.delta!r}, T={self.T!r}, d={self.d!r}. "
                    f"Found {self.gamma!r}."
                )

    @property
    def dp_guarantee(self) -> bool:
        """False for ``gamma_mode="paper_0.25"`` (Eq. (8) violated: no DP guarantee)."""
        return self.gamma_mode == "eq8"

    @property
    def label(self) -> str:
        return "Eq. (8) gamma" if self.dp_guarantee else f"paper gamma = 0.25 ({NOT_DP_LABEL})"

    @classmethod
    def from_beta(cls, beta: float, **kw) -> "BraceParams":
        beta = V.positive("beta", beta)
        return cls(r=math.sqrt(2.0 / beta), **kw)

    @property
    def rho(self) -> float:
        return rho_eps_delta(self.epsilon, self.delta)

    @property
    def noise_multiplier(self) -> float:
        """sigma_t / Delta_bar_t = sqrt(T / (2 rho)) (Step 6)."""
        return math.sqrt(self.T / (2.0 * self.rho))

    @property
    def threshold(self) -> float:
        """tau = sqrt(kappa T) r: correction activates iff ||R_t|| > tau (Eq. (2))."""
        return math.sqrt(self.kappa * self.T) * self.r

    def sigma_floor(self, n: int) -> float:
        """Public lower bound on every ``sigma_t`` for a bank of ``n`` records.

        The certificate never goes below ``2r/n`` (Eq. (7)), so
        ``sigma_t >= sqrt(T/(2 rho)) * 2r/n``; ``n`` is public (replacement neighbours).
        """
        n = V.positive_int("n", n)
        return self.noise_multiplier * 2.0 * self.r / n

    def secure_grid(self, n: int) -> float:
        """The secure sampler's grid for a bank of ``n`` records, from PUBLIC parameters only.

        ``sigma_t`` depends on the bank (through ``Delta_bar_t``), so the grid must not be
        derived from it: which power-of-two grid an output lies on is visible in its low
        bits, and a ``sigma_t`` that crosses a power of two between neighbouring banks
        would be revealed with certainty (see :mod:`fedmem.dp.samplers`). This grid is
        ``grid_granularity`` of the public floor :meth:`sigma_floor`, i.e. at most about
        ``sigma_t * 2**-20``: the rounding inflation ``(Delta_bar + g sqrt(d)) / Delta_bar``
        is then at most ``1 + noise_multiplier * sqrt(d) * 2**-20``.
        """
        return samplers.grid_granularity(self.sigma_floor(n))

    def event(self) -> ApproxDpEvent:
        """What one released trajectory costs: (epsilon, delta) by Theorem 2 / App. C.2.

        Raises ``ValueError`` for ``gamma_mode="paper_0.25"``: that setting has no DP guarantee."""
        if not self.dp_guarantee:
            raise ValueError(f"gamma_mode={self.gamma_mode!r} {NOT_DP_LABEL}; it cannot be booked. "
                             f"Found gamma={self.gamma!r}.")
        return ApproxDpEvent(epsilon=self.epsilon, delta=self.delta, mechanism="brace")
