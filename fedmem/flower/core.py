"""The one decision/booking core of fedmem's Flower wrappers (legacy and Message API).

Both :class:`fedmem.flower.gateway.SupportGatewayStrategy` (``flwr.server.strategy``) and
:class:`fedmem.flower.message_api.GatewayStrategy` (``flwr.serverapp.strategy``) delegate
to a :class:`GatewayCore`:

* **Plan and admission** (public state only): the channels of every round are fixed by the
  declared configuration; ``open_round`` asks :class:`fedmem.federation.gateway.Gateway`
  whether the round's Gaussian event fits the principal's and the total epsilon budget
  before any client computes.
* **Contract checks** (``contract_faults``): a round fails closed (nothing released,
  nothing booked) on failures, a reply set different from the sampled set, a weight
  (``num_examples``) other than the declared public constant, an undeclared metric key,
  replies of different shapes.
* **The release** (``release``): the core itself computes the value whose sensitivity it
  books: the **sum** of the replies' vectors (flattened over all arrays, unweighted:
  every weight is the public constant) plus exact discrete Gaussian noise of std
  ``noise_multiplier * sensitivity`` on a public power-of-two grid
  (:meth:`fedmem.dp.mechanisms.GaussianMechanism.release` with ``sampling="secure"``:
  every output float is reachable from every input, so the low-order bits carry
  nothing), then divided by the public ``num_sampled_clients``. Only that noised mean is
  handed to the wrapped strategy (as one reply), so whatever the wrapped strategy does
  (FedAvg, FedMedian, FedAdam, a user's own) is post-processing of a booked release and
  cannot change the privacy cost.
* **Booking** (``book``): per principal and in total, one SQLite transaction
  (``Gateway.book``), only after the release was computed and the contract held; into a
  Flower ``PrivacyAccountant`` as well when one is given.
* **Audit** (:class:`RoundRecord`): one per round, for the operator.

``sensitivity`` is the L2 change of one protected unit on the **sum** of the replies
(declared by the client contract: clients clip). The replies are summed with
``math.fsum`` per coordinate (correctly rounded), so the float error of the sum is below
half an ulp of it: far below the grid step, whose rounding the secure release's noise
inflation covers.

Configuration errors that would make every round fail are raised at construction
(``ValueError`` naming the argument and the fix): no public example count, no noise, a
budget below one round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import dp_accounting
import numpy as np

from fedmem import _validate as V
from fedmem.dp import Accountant
from fedmem.dp.mechanisms import GaussianMechanism
from fedmem.federation.aggregator import Channel, ReleasePlan
from fedmem.federation.gateway import Gateway

SAMPLING = ("secure", "fast")


@dataclass
class RoundRecord:
    """Operator's audit record of one round (never returned to the querying side)."""

    server_round: int
    query_id: int | None
    decision: str                     # "admitted" | "refused" | "fault"
    reasons: tuple = ()
    sampled: int = 0
    replied: int = 0
    failures: int = 0
    epsilon_booked: float = 0.0
    channels: tuple = ()
    bookings: list = field(default_factory=list)


def flatten(arrays) -> tuple[np.ndarray, list]:
    """One float64 vector of a list of arrays, and the shapes to split it back."""
    arrs = [np.asarray(a) for a in arrays]
    shapes = [a.shape for a in arrs]
    if not arrs:
        return np.zeros(0), shapes
    return np.concatenate([a.astype(np.float64).ravel() for a in arrs]), shapes


def unflatten(vec: np.ndarray, shapes) -> list[np.ndarray]:
    out, i = [], 0
    for s in shapes:
        n = int(np.prod(s)) if s else 1
        out.append(vec[i:i + n].reshape(s))
        i += n
    return out


def epsilon_of(multiplier: float, delta: float, kind: str = "rdp", rounds: int = 1) -> float:
    """Epsilon at ``delta`` of ``rounds`` Gaussian rounds of noise multiplier ``multiplier``."""
    acc = Accountant(kind)
    for _ in range(rounds):
        acc.book(dp_accounting.GaussianDpEvent(multiplier), "probe")
    return acc.spent(delta)


class GatewayCore:
    """Decision, release and booking of one Flower wrapper (module docstring).

    ``mode``: ``"fedmem"`` (the core noises the sum itself: ``noise_multiplier``,
    ``sensitivity``, ``rng``, ``sampling``) or ``"external"`` (the noise is added by a DP
    wrapper inside, e.g. Flower's; the core only decides and books ``noise_multiplier``).
    ``sampling="fast"`` (numpy's float Gaussian) is an explicit, **not DP** setting: its
    low-order bits identify the input (:mod:`fedmem.dp.samplers`).
    """

    def __init__(self, accountant: Accountant, *, num_sampled_clients: int, noise_multiplier, sensitivity,
                 public_num_examples, public_metric_keys=(), epsilon_budget: float = 10.0,
                 total_epsilon_budget: float = 100.0, delta: float = 1e-6, principal: str | None = None,
                 rng: np.random.Generator | None = None, sampling: str = "secure", mode: str = "fedmem",
                 label: str = "flower") -> None:
        if not isinstance(accountant, Accountant):
            raise TypeError(f"accountant must be a fedmem.dp.Accountant. Found {type(accountant).__name__}.")
        self.num_sampled_clients = V.positive_int("num_sampled_clients", num_sampled_clients, minimum=1)
        if public_num_examples is None:
            raise ValueError(
                "public_num_examples must be given: the wrapper admits a round only when every client replies "
                "with the same, declared num_examples (otherwise each reply's weight is an exact, unbooked "
                "channel and every round would be refused). Fix: make every ClientApp reply with a constant "
                "num_examples (e.g. k') and pass it as public_num_examples=k'. Found None.")
        self.public_num_examples = V.positive_int("public_num_examples", public_num_examples, minimum=1)
        if isinstance(public_metric_keys, str):
            raise ValueError(f"public_metric_keys must be a collection of names. Found {public_metric_keys!r}.")
        self.public_metric_keys = frozenset(public_metric_keys)
        self.delta = V.open_unit("delta", delta)
        if mode not in ("fedmem", "external"):
            raise ValueError(f"mode must be 'fedmem' or 'external'. Found {mode!r}.")
        self.mode = mode
        if noise_multiplier is None:
            raise ValueError(
                "noise_multiplier must be given: without noise the aggregate is an exact channel and every round "
                "would be refused. Fix: pass noise_multiplier=sigma (noise std sigma * sensitivity on the sum), "
                "or wrap a Flower DP fixed-clipping strategy (legacy wrapper, dp='flower'). Found None.")
        self.multiplier = V.positive("noise_multiplier", noise_multiplier)
        if sensitivity is None:
            raise ValueError("sensitivity must be given (L2 change of one protected unit on the sum of the "
                             "replies, as the client contract clips it). Found None.")
        self.sensitivity = V.positive("sensitivity", sensitivity)
        self.noise_std_on_sum = self.multiplier * self.sensitivity
        if sampling not in SAMPLING:
            raise ValueError(f"sampling must be one of {SAMPLING}. Found {sampling!r}.")
        self.sampling = sampling
        if mode == "fedmem":
            if rng is None:
                raise ValueError("rng must be a numpy.random.Generator (the release's noise). Found None.")
            V.rng_check("rng", rng)
        self.rng = rng
        self.label = label
        self.gateway = Gateway(accountant, enabled=True, epsilon_budget=epsilon_budget,
                               total_epsilon_budget=total_epsilon_budget, delta=self.delta,
                               support_budget_bits=math.inf, total_support_budget_bits=math.inf)
        self.plan = self.round_plan()
        one = self.epsilon_per_round
        for name, budget in (("epsilon_budget", self.gateway.epsilon_budget),
                             ("total_epsilon_budget", self.gateway.total_epsilon_budget)):
            if budget < one:
                raise ValueError(
                    f"{name} must allow at least one round: one round costs epsilon {one:.4g} at delta "
                    f"{self.delta:g} (noise_multiplier {self.multiplier:g}). Fix: raise {name} to >= {one:.4g} "
                    f"or raise noise_multiplier. Found {budget!r}.")
        self.principal = principal if principal is not None else self.gateway.new_principal()
        self.audit: list[RoundRecord] = []
        self._open: dict[int, tuple] = {}      # server_round -> (decision, sampled node ids)

    # ------------------------------------------------------------------ plan (public)
    def round_plan(self) -> ReleasePlan:
        """Channels of every round, from the declared configuration alone."""
        chans = (Channel("reply_set", "public", True), Channel("num_examples", "public", True),
                 Channel("metrics:client", "public", True),
                 Channel("value", "dp", False, dp_accounting.GaussianDpEvent(self.multiplier)))
        return ReleasePlan(chans, "flower", "public", self.multiplier)

    @property
    def epsilon_per_round(self) -> float:
        """Epsilon at ``delta`` of one admitted round (the accountant's, for one event)."""
        return epsilon_of(self.multiplier, self.delta, self.gateway.accountant.kind)

    def spent(self) -> float:
        """Epsilon at ``delta`` the principal has spent so far."""
        return self.gateway.principal_spent(self.principal)

    # ------------------------------------------------------------------ decision
    def drop_stale(self, server_round: int) -> None:
        """Close every round still open at ``server_round``'s start: its aggregation never came
        (e.g. ``SecAggPlusWorkflow`` halted). Nothing was released or booked; logged as a fault."""
        stale = [r for r in self._open if r <= server_round]
        for r in stale:
            decision, sampled = self._open.pop(r)
            if r < server_round:
                self.audit.append(RoundRecord(r, decision.query_id, "fault", ("no_aggregate_fit",),
                                              sampled=len(sampled)))
        if stale:
            self.gateway.clear_pending()

    def decide(self, server_round: int):
        """Admission of a round from public state (the budgets). Returns the decision (reserved
        until :meth:`close`); a refusal is recorded in the audit."""
        self.drop_stale(server_round)
        qid = self.gateway.register(self.principal, [f"round{server_round}"], [None])[0]
        decision = self.gateway.decide(qid, self.principal, f"round{server_round}", None, {"primary": self.plan})
        if not decision.admitted:
            self.gateway.clear_pending()
            self.audit.append(RoundRecord(server_round, qid, "refused", decision.reasons))
        return decision

    def refuse(self, server_round: int, decision, reasons: tuple, sampled: int = 0) -> None:
        self.gateway.clear_pending()
        self.audit.append(RoundRecord(server_round, decision.query_id, "refused", reasons, sampled=sampled))

    def open(self, server_round: int, decision, sampled_ids) -> None:
        self._open[server_round] = (decision, set(sampled_ids))

    def take(self, server_round: int):
        """The open round's (decision, sampled ids), or None (refused / never configured)."""
        return self._open.pop(server_round, None)

    def close(self) -> None:
        self.gateway.clear_pending()

    # ------------------------------------------------------------------ contract
    def contract_faults(self, sampled: set, replied_ids, weights, metric_keys, shapes, n_failures: int) -> list[str]:
        """Why a round must fail closed (empty: the contract held)."""
        reasons = []
        replied = list(replied_ids)
        if n_failures:
            reasons.append("failures")
        if set(replied) != sampled or len(replied) != len(sampled) or len(replied) != self.num_sampled_clients:
            reasons.append("reply_set")
        if any(w != self.public_num_examples for w in weights):
            reasons.append("num_examples")
        if any(set(k) - self.public_metric_keys for k in metric_keys):
            reasons.append("metrics:client")
        if len({tuple(map(tuple, s)) for s in shapes}) > 1:
            reasons.append("shapes")
        return reasons

    # ------------------------------------------------------------------ release
    def noised_sum(self, vectors: list[np.ndarray]) -> np.ndarray:
        """The booked release: exact-ish sum of ``vectors`` (fsum per coordinate) plus the noise."""
        if self.mode != "fedmem":
            raise RuntimeError("noised_sum is only for mode='fedmem'.")
        mat = np.stack([np.asarray(v, dtype=np.float64) for v in vectors])
        if not np.all(np.isfinite(mat)):
            raise ValueError("replies must be finite. Found a non-finite entry.")
        total = np.array([math.fsum(col) for col in mat.T], dtype=np.float64)
        mech = GaussianMechanism(sigma=self.noise_std_on_sum, l2_sensitivity=self.sensitivity)
        return mech.release(total, self.rng, sampling=self.sampling)

    def release(self, reply_arrays: list[list]) -> list[np.ndarray]:
        """Noised mean (noised sum / ``num_sampled_clients``) of the replies' array lists, as arrays
        of the replies' shapes. Division by the public count is post-processing."""
        flat = [flatten(a) for a in reply_arrays]
        noised = self.noised_sum([f[0] for f in flat])
        return unflatten(noised / float(self.num_sampled_clients), flat[0][1])

    # ------------------------------------------------------------------ booking
    def book(self, server_round: int, decision, record: RoundRecord):
        """Book one admitted round (raises :class:`~fedmem.errors.BudgetExceeded`, nothing written)."""
        record.bookings = self.gateway.book(decision, self.plan, f"{self.label} round {server_round}")
        record.decision = "admitted"
        record.epsilon_booked = self.spent()
        return record.bookings
