"""fedmem's support gateway as a Flower strategy wrapper (Flower 1.42, legacy ``Strategy`` API).

Built the way Flower's DP wrappers are (``DifferentialPrivacyClientSideFixedClipping(
strategy, ...)``): :class:`SupportGatewayStrategy` wraps any ``flwr.server.strategy.Strategy``
and sits between what the Flower server sees in a round and what the strategy hands on
(``aggregate_fit``'s return value: the parameters stored in the ServerApp's state, sent to
clients next round, read by whoever consumes the run).

**What the Flower server sees in a fit round** (``aggregate_fit`` arguments, also with
``SecAggPlusWorkflow``): the sampled node set, which nodes replied and which failed (the
*reply set*; its size against ``num_sampled_clients``), every reply's ``num_examples`` and
``metrics`` in plaintext, and the aggregate. Classified as fedmem channels
(:class:`fedmem.federation.aggregator.Channel`):

=====================  ===========================================================  ============
channel                when                                                          kind
=====================  ===========================================================  ============
``reply_set``          always: sampled by the client manager (data-independent);     public
                       a reply set != sampled set is a fault and fails closed
``num_examples``       ``public_num_examples`` declared (the client contract)         public
                       not declared: per-client example counts (papers/003 receipts) exact
``metrics:client``     ``public_metric_keys`` declared, or none sent                  public
                       otherwise (per-client metrics are never forwarded anyway)     exact
``metrics:aggregated`` the inner strategy's aggregated metrics: never forwarded     (withheld)
``value``              a DP mechanism is known (Flower's DP wrapper inside, or        dp
                       fedmem's own noise: ``noise_multiplier=``)
                       no DP mechanism                                                exact
=====================  ===========================================================  ============

**Decisions, from public state only** (``fedmem.federation.gateway.Gateway.decide``,
reused): in ``configure_fit``, before any client computes, the round's plan (channels
above, from the declared configuration) must be bookable and its DP event must fit the
principal's and the total epsilon budget; else ``configure_fit`` returns ``[]`` (Flower
cancels the round: "no clients selected"). A plan with an exact channel is refused in
**every** round, so the refusal says nothing about the data. In ``aggregate_fit`` the
round fails closed (``(None, {})``: no aggregate, nothing booked) on any fault or broken
contract: failures, a reply set different from the sampled set, a ``num_examples`` other
than the declared constant, an undeclared metric key, no aggregate from the inner strategy.
Only then is the DP event booked (per principal and in total, one SQLite transaction,
``Gateway.book`` / ``fedmem.dp.book_together``) and the aggregate returned; if booking
fails (a concurrent writer spent the budget) the aggregate is dropped.

**DP mechanism and what is booked.** ``dp="flower"``: the wrapped strategy is (or wraps)
Flower's ``DifferentialPrivacyClientSideFixedClipping`` / ``ServerSideFixedClipping``:
it adds ``N(0, (sigma_f C_f / m)^2)`` to the mean over ``m = num_sampled_clients``, i.e.
noise ``sigma_f C_f`` on the sum; booked ``GaussianDpEvent(sigma_f C_f / sensitivity)``
(``sensitivity`` defaults to ``C_f``: Flower's add/remove-one-client claim). That is right
only when all ``m`` sampled clients replied with equal weights, which the contract checks
enforce (Flower itself only *warns* when fewer replied: its noise is then too small for
the mean it perturbs). ``dp="fedmem"``: this wrapper adds ``N(0, (sigma sensitivity /
m)^2)`` to the inner strategy's mean from an injected ``numpy.random.Generator`` and books
``GaussianDpEvent(sigma)``. ``sensitivity``: L2 change of one protected unit (a record) on
the **sum** of the clients' vectors, declared by the client contract.

**What this cannot do in Flower 1.42** (docs/flower.md): the server process itself
still sees the reply set, ``num_examples`` and metrics (the wrapper only decides what
leaves the strategy) and, with ``SecAggPlusWorkflow``, the exact unmasked sum (central DP
is added after unmasking); Flower's workflow logs ``received N results and F failures`` at
INFO level (silence ``flwr`` logging in production); federated evaluation is not gated and
is disabled by this wrapper (``configure_evaluate`` returns ``[]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import dp_accounting
import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    Strategy,
)

from fedmem import _validate as V
from fedmem.dp import Accountant
from fedmem.errors import BudgetExceeded
from fedmem.federation.aggregator import Channel, ReleasePlan
from fedmem.federation.gateway import Gateway

DP_MODES = ("auto", "flower", "fedmem", "none")
FLOWER_DP = (DifferentialPrivacyClientSideFixedClipping, DifferentialPrivacyServerSideFixedClipping)


def find_flower_dp(strategy):
    """The first Flower fixed-clipping DP wrapper in ``strategy``'s ``.strategy`` chain, or None."""
    seen = 0
    s = strategy
    while s is not None and seen < 32:
        if isinstance(s, FLOWER_DP):
            return s
        s = getattr(s, "strategy", None)
        seen += 1
    return None


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


class SupportGatewayStrategy(Strategy):
    """Wrap a Flower strategy so only booked or public channels leave a fit round (module doc).

    Parameters: ``strategy`` (the wrapped Flower strategy), ``accountant`` (fedmem
    :class:`~fedmem.dp.Accountant`: the total; per-principal accountants live in its store),
    ``num_sampled_clients`` (public m; every round must sample exactly m), ``dp``
    (``"auto"``: Flower's DP wrapper if one is inside, else fedmem's if
    ``noise_multiplier`` is given, else none), ``noise_multiplier`` and ``sensitivity``
    (fedmem's noise), ``public_num_examples`` and ``public_metric_keys`` (the client
    contract; None/empty leaves those channels exact), ``epsilon_budget`` /
    ``total_epsilon_budget`` at ``delta`` (``math.inf`` disables), ``principal`` (the
    querying identity the budgets are charged to; default: a fresh one), ``rng`` (fedmem's
    noise; required for ``dp="fedmem"``).
    """

    def __init__(self, strategy: Strategy, accountant: Accountant, *, num_sampled_clients: int,
                 dp: str = "auto", noise_multiplier: float | None = None, sensitivity: float | None = None,
                 public_num_examples: int | None = None, public_metric_keys=(),
                 epsilon_budget: float = 10.0, total_epsilon_budget: float = 100.0, delta: float = 1e-6,
                 principal: str | None = None, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        if not isinstance(strategy, Strategy):
            raise TypeError(f"strategy must be a flwr.server.strategy.Strategy. Found {type(strategy).__name__}.")
        self.strategy = strategy
        self.num_sampled_clients = V.positive_int("num_sampled_clients", num_sampled_clients, minimum=1)
        if dp not in DP_MODES:
            raise ValueError(f"dp must be one of {DP_MODES}. Found {dp!r}.")
        if public_num_examples is not None:
            public_num_examples = V.positive_int("public_num_examples", public_num_examples, minimum=1)
        self.public_num_examples = public_num_examples
        if isinstance(public_metric_keys, str):
            raise ValueError(f"public_metric_keys must be a collection of names. Found {public_metric_keys!r}.")
        self.public_metric_keys = frozenset(public_metric_keys)
        self.delta = V.open_unit("delta", delta)
        flower_dp = find_flower_dp(strategy)
        if dp == "auto":
            dp = "flower" if flower_dp is not None else ("fedmem" if noise_multiplier is not None else "none")
        self.dp = dp
        self.rng = rng
        if dp == "flower":
            if flower_dp is None:
                raise ValueError("dp='flower' needs a Flower DifferentialPrivacy*FixedClipping wrapper inside "
                                 f"strategy. Found {type(strategy).__name__} without one.")
            if noise_multiplier is not None:
                raise ValueError(f"noise_multiplier must be None with dp='flower' (Flower's wrapper adds the noise). "
                                 f"Found {noise_multiplier!r}.")
            if flower_dp.num_sampled_clients != self.num_sampled_clients:
                raise ValueError(f"num_sampled_clients must equal the Flower DP wrapper's "
                                 f"({flower_dp.num_sampled_clients}). Found {num_sampled_clients!r}.")
            sens = float(flower_dp.clipping_norm) if sensitivity is None else V.positive("sensitivity", sensitivity)
            # Flower: N(0, (sigma_f C_f / m)^2) on the mean of m equal-weight replies = sigma_f C_f on the sum.
            self.noise_std_on_sum = float(flower_dp.noise_multiplier) * float(flower_dp.clipping_norm)
            self.sensitivity = sens
            self.multiplier = self.noise_std_on_sum / sens if self.noise_std_on_sum > 0 else 0.0
        elif dp == "fedmem":
            self.multiplier = V.positive("noise_multiplier", noise_multiplier)
            if sensitivity is None:
                raise ValueError("sensitivity must be given with dp='fedmem' (L2 change of one unit on the sum). "
                                 "Found None.")
            self.sensitivity = V.positive("sensitivity", sensitivity)
            self.noise_std_on_sum = self.multiplier * self.sensitivity
            V.rng_check("rng", rng)
        else:
            if noise_multiplier is not None:
                raise ValueError(f"noise_multiplier must be None with dp='none'. Found {noise_multiplier!r}.")
            self.multiplier, self.sensitivity, self.noise_std_on_sum = 0.0, sensitivity, 0.0
        self.gateway = Gateway(accountant, enabled=True, epsilon_budget=epsilon_budget,
                               total_epsilon_budget=total_epsilon_budget, delta=self.delta,
                               support_budget_bits=math.inf, total_support_budget_bits=math.inf)
        self.principal = principal if principal is not None else self.gateway.new_principal()
        self.plan = self.round_plan()
        self.audit: list[RoundRecord] = []
        self._open: dict[int, tuple] = {}      # server_round -> (decision, sampled node ids)

    # ------------------------------------------------------------------ plan (public)
    def round_plan(self) -> ReleasePlan:
        """Channels of every fit round, from the declared configuration alone."""
        chans = [Channel("reply_set", "public", True)]
        chans.append(Channel("num_examples", "public" if self.public_num_examples is not None else "exact", True))
        # Per-client metrics: only declared data-independent keys are allowed (anything else is a broken
        # contract and fails the round closed); they are never forwarded.
        chans.append(Channel("metrics:client", "public", True))
        if self.multiplier > 0:
            chans.append(Channel("value", "dp", False, dp_accounting.GaussianDpEvent(self.multiplier)))
        else:
            chans.append(Channel("value", "exact", False))
        return ReleasePlan(tuple(chans), "flower", "public" if self.public_num_examples is not None else "exact",
                           self.multiplier if self.multiplier > 0 else None)

    @property
    def epsilon_per_round(self) -> float:
        """Epsilon at ``delta`` of one admitted round (the accountant's, for one event)."""
        if not self.plan.bookable:
            return math.inf
        acc = Accountant(self.gateway.accountant.kind)
        acc.book(self.plan.event(), "probe")
        return acc.spent(self.delta)

    def __repr__(self) -> str:
        return (f"SupportGatewayStrategy(strategy={self.strategy!r}, dp={self.dp!r}, multiplier={self.multiplier:.4g}, "
                f"num_sampled_clients={self.num_sampled_clients}, principal={self.principal!r})")

    # ------------------------------------------------------------------ passthrough
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.strategy.initialize_parameters(client_manager)

    def evaluate(self, server_round: int, parameters: Parameters):
        # Centralized evaluation runs on the server's own data: no client channel.
        return self.strategy.evaluate(server_round, parameters)

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        # Federated evaluation (loss, num_examples, metrics per client) is not gated: disabled.
        return []

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}

    # ------------------------------------------------------------------ fit round
    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        self._drop(server_round)
        qid = self.gateway.register(self.principal, [f"round{server_round}"], [None])[0]
        decision = self.gateway.decide(qid, self.principal, f"round{server_round}", None, {"primary": self.plan})
        if not decision.admitted:
            self.gateway.clear_pending()
            self.audit.append(RoundRecord(server_round, qid, "refused", decision.reasons))
            return []
        instructions = self.strategy.configure_fit(server_round, parameters, client_manager)
        if len(instructions) != self.num_sampled_clients:
            self.gateway.clear_pending()
            self.audit.append(RoundRecord(server_round, qid, "refused", ("sampled_count",),
                                          sampled=len(instructions)))
            return []
        self._open[server_round] = (decision, {proxy.node_id for proxy, _ in instructions})
        return instructions

    def _drop(self, server_round: int) -> None:
        """Close every round still open at ``server_round``'s start: its ``aggregate_fit`` never came
        (e.g. ``SecAggPlusWorkflow`` halted for lack of shares). Nothing was released or booked for
        it; it is logged as a fault and its pending charge is released."""
        stale = [r for r in self._open if r <= server_round]
        for r in stale:
            decision, sampled = self._open.pop(r)
            if r < server_round:
                self.audit.append(RoundRecord(r, decision.query_id, "fault", ("no_aggregate_fit",),
                                              sampled=len(sampled)))
        if stale:
            self.gateway.clear_pending()

    def _contract_faults(self, sampled: set, results, failures) -> list[str]:
        reasons = []
        if failures:
            reasons.append("failures")
        replied = [proxy.node_id for proxy, _ in results]
        if set(replied) != sampled or len(replied) != len(sampled):
            reasons.append("reply_set")
        for _, res in results:
            if self.public_num_examples is not None and res.num_examples != self.public_num_examples:
                reasons.append("num_examples")
                break
        for _, res in results:
            if set(res.metrics or {}) - self.public_metric_keys:
                reasons.append("metrics:client")
                break
        return reasons

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures) -> tuple[Parameters | None, dict[str, Scalar]]:
        opened = self._open.pop(server_round, None)
        if opened is None:        # refused in configure_fit (or never configured): nothing leaves
            return None, {}
        decision, sampled = opened
        rec = RoundRecord(server_round, decision.query_id, "fault", sampled=len(sampled), replied=len(results),
                          failures=len(failures), channels=tuple(c.name for c in self.plan.channels))
        self.audit.append(rec)
        try:
            reasons = self._contract_faults(sampled, results, failures)
            if reasons:
                rec.reasons = tuple(reasons)
                return None, {}
            params, _withheld_metrics = self.strategy.aggregate_fit(server_round, results, failures)
            if params is None:
                rec.reasons = ("no_aggregate",)
                return None, {}
            if self.dp == "fedmem":
                arrays = parameters_to_ndarrays(params)
                std = self.noise_std_on_sum / self.num_sampled_clients
                arrays = [np.asarray(a, dtype=np.float64) + self.rng.normal(0.0, std, size=np.shape(a))
                          for a in arrays]
                params = ndarrays_to_parameters(arrays)
            try:
                rec.bookings = self.gateway.book(decision, self.plan, f"flower round {server_round}")
            except BudgetExceeded:
                rec.reasons = ("epsilon_budget",)
                return None, {}
            rec.decision = "admitted"
            rec.epsilon_booked = self.gateway.principal_spent(self.principal)
            return params, {}
        finally:
            self.gateway.clear_pending()
