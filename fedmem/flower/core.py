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
* **Reply checks and clipping, on the server** (:meth:`GatewayCore.prepare`): every reply
  is checked on its own, before anything is summed: a non-float array (``"dtype"``), a
  NaN/inf entry (``"non_finite"``), a vector whose L2 norm overflows float64
  (``"too_large"``) or a shape other than the others' (``"shapes"``) refuses the round.
  Then ``clipping="server"`` (the default, as Flower's
  ``DifferentialPrivacyServerSideFixedClipping``) scales each reply's flattened vector to
  L2 norm <= ``clip_norm`` (default: ``sensitivity``); ``clipping="client"`` (the clients
  clip, as with Flower's ``fixedclipping_mod``: :func:`fedmem.flower.mods.fixedclipping_mod`)
  refuses the round (``"norm"``) if any reply is above it. Either way every reply that
  enters the sum has L2 norm <= ``clip_norm``: with ``clip_norm = sensitivity`` (client-level
  adjacency, Flower's convention) the booked sensitivity is enforced by the side that books
  it. A larger ``clip_norm`` is for record-level adjacency, where one protected record moves
  one honest client's reply by at most ``sensitivity`` while replies themselves are larger
  (fedmem's memory shards: ``[top-k' value sum, count]``): the server then enforces the
  public reply bound (no reply, honest or not, moves the sum by more than ``clip_norm``, so
  the range limit cannot be reached and a misconfigured client cannot push an arbitrary
  value), while the record-level ``sensitivity`` is the honest client's own computation
  (clipping, a projection onto a ball, is 1-Lipschitz, so it never enlarges that change).
  Each check depends on one reply only, so a refusal caused by a malicious client's reply
  says nothing about an honest client's.
* **The release** (``release``): the core itself computes the value whose sensitivity it
  books: the **sum** of the clipped replies (flattened over all arrays, unweighted: every
  weight is the public constant), in **fixed point on integers**: each clipped reply is
  rounded to the release's public grid ``g`` (``rint(x / g)``, int64) and the integer
  vectors are summed by numpy, so the work depends only on the public shapes (the
  previous ``math.fsum`` per coordinate took value-dependent time: AUC 0.80 between
  neighbouring replies, issue 37). The integer sum times ``g`` is already on the grid;
  exact discrete Gaussian noise of std ``noise_multiplier * sensitivity`` (inflated, see
  below) is added on that grid (:meth:`fedmem.dp.mechanisms.GaussianMechanism.release`,
  ``sampling="secure"``: every output float is reachable from every input, so the
  low-order bits carry nothing), then divided by the public ``num_sampled_clients``. Only
  that noised mean is handed to the wrapped strategy (as one reply), so whatever the
  wrapped strategy does (FedAvg, FedMedian, FedAdam, a user's own) is post-processing of a
  booked release and cannot change the privacy cost.
* **Booking** (``book``): per principal and in total, one SQLite transaction
  (``Gateway.book``), after the release was computed and **before** anyone sees it: the
  wrappers hand the wrapped strategy, the server log and the caller the release only after
  the booking committed (a booking that fails drops it: nothing released). Wrappers that
  share one store (same :class:`~fedmem.dp.DurableStore` object, or the same file) see each
  other's admitted, unbooked rounds: one set of pending charges per store
  (``Gateway.charges`` / ``Gateway.hold``), so a budget that fits one more round admits one.
* **Fail closed without values**: any exception inside the decision, the contract checks,
  the release or the booking becomes the uniform refusal (legacy ``(None, {})``, Message
  API no aggregate): nothing released, nothing booked, no message, log line or exception
  carrying a value; the audit record keeps a value-free reason code
  (``"<stage>_error:<ExceptionType>"``, never the exception's text).
* **Audit** (:class:`RoundRecord`): one per round, for the operator.

**What is booked, exactly.** ``GaussianDpEvent(noise_multiplier)`` per admitted round, for
an L2 sensitivity ``sensitivity`` = C on the sum: neighbouring rounds differ in one
client's reply by at most C in L2 (add/remove a client, i.e. its reply against the zero
vector, Flower's client-level convention; replacing a reply by another changes the sum
by up to 2C, so book ``sensitivity = 2 * clip`` for replace-one adjacency). Server-side
clipping makes ``||reply|| <= C`` a fact. Rounding each reply to the grid moves every
coordinate by at most ``g/2``, so ``|rint(x/g) - rint(x'/g)| g <= |x - x'| + g`` per
coordinate and the integer sums of neighbouring rounds differ by at most ``C + g sqrt(d)``
in L2. The noise actually drawn is the secure release's: std ``sigma (C + g sqrt(d)) / C``
(``sigma = noise_multiplier * C``, rounded up by at most a factor ``1 + 2**-20``), the
inflation the secure release applies for its own snap to the grid, which here is exact (the
sum is already on the grid) and therefore covers the per-reply rounding instead; the
mechanism is the discrete Gaussian of variance parameter ``sigma'^2 >= sigma^2 ((C + g
sqrt(d)) / C)^2`` on an integer-valued sum of sensitivity ``<= C + g sqrt(d)``, i.e. exactly
the booked ``rho = 1 / (2 noise_multiplier^2)`` zCDP (CKS20 Thm. 4). The scale of the clip
factor ``C / ||x||`` in floats can exceed C by a relative 2**-52, 12 orders of magnitude
below the ``g sqrt(d)`` slack (g is ``sigma * 2**-20``).

**Range.** At construction ``num_sampled_clients * (clip_norm / g + 1)`` (the largest
integer sum clipped replies can reach) plus ``TAIL_SIGMAS`` noise standard deviations
(in grid units) must stay below ``2**52`` (the secure sampler's range limit: the values it
releases are integers times ``g`` below ``2**52 g``, so every one is an exact float);
otherwise ``ValueError`` names ``num_sampled_clients``, ``sensitivity`` and
``noise_multiplier``. Clipped replies never reach the limit, so the range error of the
sampler (which carried the exact sum in its text: issue 37's range-limit oracle) cannot
fire from a reply.

Configuration errors that would make every round fail are raised at construction
(``ValueError`` naming the argument and the fix): no public example count, no noise, a
budget below one round, a bound that does not fit the sampler's range.
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from dataclasses import dataclass, field

import dp_accounting
import numpy as np

from fedmem import _validate as V
from fedmem.dp import Accountant
from fedmem.dp.mechanisms import GaussianMechanism
from fedmem.dp.samplers.grid import grid_granularity, inflated_units
from fedmem.federation.aggregator import Channel, ReleasePlan
from fedmem.federation.gateway import Gateway

SAMPLING = ("secure", "fast")
CLIPPING = ("server", "client")
#: Noise standard deviations (inflated, in grid units) the range check leaves room for beside the
#: largest clipped sum: the discrete Gaussian exceeds 64 sigma with probability below exp(-2048).
TAIL_SIGMAS = 64
RANGE_LIMIT = 2 ** 52          # the secure sampler's limit on |value| / grid (fedmem.dp.samplers)
_TINY = np.finfo(np.float64).tiny

# One set of pending (admitted, not yet booked) charges per store, shared by every GatewayCore on it:
# store key -> {(core token, server_round): [(ledger name, events), ...]}. Guarded by _PENDING_LOCK.
_PENDING: dict[tuple, dict[tuple, list]] = {}
_PENDING_LOCK = threading.RLock()


_TOKENS = itertools.count()
_STORE_TOKENS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # in-memory store -> unique token


def _store_key(store) -> tuple:
    """One key per store: its file, or (in memory) a token never reused (an ``id`` is, after the store is gone)."""
    path = getattr(store, "path", None)
    if path is not None:
        return ("file", str(path.resolve()))
    with _PENDING_LOCK:
        tok = _STORE_TOKENS.get(store)
        if tok is None:
            tok = _STORE_TOKENS[store] = next(_TOKENS)
    return ("memory", tok)


def _drop_reservations(store_key: tuple, token: int) -> None:
    """Drop every reservation of the core ``token`` (called when that core is garbage collected)."""
    with _PENDING_LOCK:
        res = _PENDING.get(store_key, {})
        for key in [k for k in res if k[0] == token]:
            del res[key]
        if not res:
            _PENDING.pop(store_key, None)


@dataclass
class RoundRecord:
    """Operator's audit record of one round (never returned to the querying side)."""

    server_round: int
    query_id: int | None
    decision: str                     # "admitted" | "refused" | "fault"
    reasons: tuple = ()               # value-free reason codes
    detail: dict = field(default_factory=dict)   # operator-only context (e.g. the num_examples that came back)
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
                 label: str = "flower", clipping: str = "server", clip_norm: float | None = None) -> None:
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
        if clipping not in CLIPPING:
            raise ValueError(f"clipping must be one of {CLIPPING} ('server': the wrapper clips every reply to L2 "
                             f"<= sensitivity; 'client': it refuses a round with a reply above it). Found {clipping!r}.")
        self.clipping = clipping
        self.clip_norm = self.sensitivity if clip_norm is None else V.positive("clip_norm", clip_norm)
        self.grid = grid_granularity(self.noise_std_on_sum)     # public: from the declared configuration
        if mode == "fedmem":
            self._check_range()
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
        self._token = next(_TOKENS)      # this core's reservations (never reused, unlike id())
        weakref.finalize(self, _drop_reservations, _store_key(self.gateway.store), self._token)
        self.audit: list[RoundRecord] = []
        self._open: dict[int, tuple] = {}      # server_round -> (decision, sampled node ids)

    def _check_range(self, d: int = 1) -> None:
        """The public bound on the integer sum plus the noise tail fits the sampler's range (module doc)."""
        g, C, m = self.grid, self.clip_norm, self.num_sampled_clients
        units = float(inflated_units("gaussian", self.noise_std_on_sum, g, self.sensitivity, max(int(d), 1)))
        bound = m * (math.floor(C / g) + 1) + TAIL_SIGMAS * units
        if not bound < RANGE_LIMIT:
            raise ValueError(
                f"num_sampled_clients x sensitivity (clip_norm) must fit the secure sampler's range: the clipped sum "
                f"can reach "
                f"{m} x {C:g} = {m * C:g} and the noise tail {TAIL_SIGMAS} x {self.noise_std_on_sum:g}, on the grid "
                f"{g!r} (noise_multiplier x sensitivity x 2**-20) the sampler releases values below 2**52 grid steps "
                f"= {math.ldexp(g, 52):g}. Fix: raise noise_multiplier or lower num_sampled_clients. Found "
                f"num_sampled_clients={m!r}, sensitivity={self.sensitivity!r}, clip_norm={C!r}, "
                f"noise_multiplier={self.multiplier!r}.")

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
            self._release_pending()

    # Pending charges, one set per store (module docstring): every core on a store holds, before it
    # decides, what every other core on it admitted and has not booked yet.
    def _reservations(self) -> dict:
        return _PENDING.setdefault(_store_key(self.gateway.store), {})

    def _release_pending(self, rounds=None) -> None:
        """Drop this core's reservations (of ``rounds``; ``None``: of every round no longer open)."""
        with _PENDING_LOCK:
            res = self._reservations()
            for key in [k for k in res if k[0] == self._token and
                        (k[1] in rounds if rounds is not None else k[1] not in self._open)]:
                del res[key]
            if not res:
                _PENDING.pop(_store_key(self.gateway.store), None)
            self.gateway.clear_pending()

    def decide(self, server_round: int):
        """Admission of a round from public state (the budgets, and every charge admitted and not yet
        booked on this store by any wrapper). Returns the decision (reserved until :meth:`close`); a
        refusal is recorded in the audit."""
        self.drop_stale(server_round)
        qid = self.gateway.register(self.principal, [f"round{server_round}"], [None])[0]
        with _PENDING_LOCK:
            res = self._reservations()
            self.gateway.clear_pending()
            for charges in res.values():
                for ledger, events in charges:
                    self.gateway.hold(ledger, events)
            try:
                decision = self.gateway.decide(qid, self.principal, f"round{server_round}", None,
                                               {"primary": self.plan})
                if decision.admitted:
                    res[(self._token, server_round)] = self.gateway.charges(decision, self.plan)
            finally:
                self.gateway.clear_pending()
                if not res:
                    _PENDING.pop(_store_key(self.gateway.store), None)
        if not decision.admitted:
            self.audit.append(RoundRecord(server_round, qid, "refused", decision.reasons))
        return decision

    def refuse(self, server_round: int, decision, reasons: tuple, sampled: int = 0) -> None:
        self._release_pending([server_round])
        self.audit.append(RoundRecord(server_round, decision.query_id, "refused", reasons, sampled=sampled))

    def open(self, server_round: int, decision, sampled_ids) -> None:
        self._open[server_round] = (decision, set(sampled_ids))

    def take(self, server_round: int):
        """The open round's (decision, sampled ids), or None (refused / never configured)."""
        return self._open.pop(server_round, None)

    def close(self) -> None:
        """End the round(s) taken: their pending charges leave the store's pending set."""
        self._release_pending()

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

    # ------------------------------------------------------------------ replies: checks and clipping
    def prepare(self, reply_arrays: list[list]) -> tuple[list[str], np.ndarray | None, list]:
        """Check every reply on its own, then clip (module docstring). Returns ``(reasons, matrix,
        shapes)``: the refusal reasons (empty: admitted) and the clipped replies' flattened vectors
        (one row per reply, float64, every row of L2 norm <= ``clip_norm``), or ``None``."""
        reasons: list[str] = []
        if not reply_arrays:
            return ["reply_set"], None, []
        layouts = set()
        for arrays in reply_arrays:
            arrs = [np.asarray(a) for a in arrays]
            if any(a.dtype.kind != "f" for a in arrs):
                if "dtype" not in reasons:
                    reasons.append("dtype")
            layouts.add(tuple(a.shape for a in arrs))
        if len(layouts) > 1:
            reasons.append("shapes")
        if reasons:
            return reasons, None, []
        shapes = [np.asarray(a).shape for a in reply_arrays[0]]
        with np.errstate(all="ignore"):
            mat = np.stack([flatten(a)[0] for a in reply_arrays])
            if not np.all(np.isfinite(mat)):
                return ["non_finite"], None, shapes
            norms = np.sqrt(np.einsum("ij,ij->i", mat, mat))
            if not np.all(np.isfinite(norms)):
                return ["too_large"], None, shapes
            C = self.clip_norm
            if self.clipping == "client":
                if np.any(norms > C):
                    return ["norm"], None, shapes
            else:
                mat = mat * np.minimum(1.0, C / np.maximum(norms, _TINY))[:, None]
            mat = np.where(np.abs(mat) < _TINY, 0.0, mat)     # no subnormals in the arithmetic below
        return [], mat, shapes

    # ------------------------------------------------------------------ release
    def fixed_point_sum(self, mat: np.ndarray) -> np.ndarray:
        """The integer sum, in grid units, of the (clipped) rows of ``mat``: ``sum_i rint(x_i / g)``
        (int64, vectorised: time depends on the shape only)."""
        return np.rint(mat / self.grid).astype(np.int64).sum(axis=0)

    def noised_sum(self, mat: np.ndarray) -> np.ndarray:
        """The booked release: the fixed-point sum of the clipped rows of ``mat`` plus the noise."""
        if self.mode != "fedmem":
            raise RuntimeError("noised_sum is only for mode='fedmem'.")
        total = self.fixed_point_sum(mat)
        self._check_range(total.size)      # public: the shape's rounding inflation
        mech = GaussianMechanism(sigma=self.noise_std_on_sum, l2_sensitivity=self.sensitivity)
        grid = self.grid if self.sampling == "secure" else None
        return mech.release(total.astype(np.float64) * self.grid, self.rng, sampling=self.sampling, grid=grid)

    def release(self, reply_arrays: list[list]) -> list[np.ndarray] | None:
        """Noised mean (noised sum / ``num_sampled_clients``) of the replies' array lists, as arrays
        of the replies' shapes; raises :class:`Refused` (a reason code, no value) when a reply is
        refused. Division by the public count is post-processing."""
        reasons, mat, shapes = self.prepare(reply_arrays)
        if reasons:
            raise Refused(tuple(reasons))
        noised = self.noised_sum(mat)
        return unflatten(noised / float(self.num_sampled_clients), shapes)

    def clipped(self, reply_arrays: list[list]) -> list[list[np.ndarray]]:
        """The replies, checked and clipped (mode ``"external"``: what Flower's DP wrapper inside gets);
        raises :class:`Refused` as :meth:`release`."""
        reasons, mat, shapes = self.prepare(reply_arrays)
        if reasons:
            raise Refused(tuple(reasons))
        return [unflatten(row, shapes) for row in mat]

    # ------------------------------------------------------------------ booking
    def book(self, server_round: int, decision, record: RoundRecord):
        """Book one admitted round (raises :class:`~fedmem.errors.BudgetExceeded`, nothing written)."""
        record.bookings = self.gateway.book(decision, self.plan, f"{self.label} round {server_round}")
        record.decision = "admitted"
        record.epsilon_booked = self.spent()
        return record.bookings


class Refused(Exception):
    """A round refused by a check of the replies: carries value-free reason codes only."""

    def __init__(self, reasons: tuple):
        super().__init__(",".join(reasons))
        self.reasons = tuple(reasons)


def error_code(stage: str, exc: BaseException) -> str:
    """The audit's value-free reason for an exception at ``stage`` (its type's name, never its text)."""
    return f"{stage}_error:{type(exc).__name__}"
