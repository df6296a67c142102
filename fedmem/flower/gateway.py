"""fedmem's support gateway as a Flower strategy wrapper (Flower 1.42, legacy ``Strategy`` API).

Built the way Flower's DP wrappers are (``DifferentialPrivacyClientSideFixedClipping(
strategy, ...)``): :class:`SupportGatewayStrategy` wraps a ``flwr.server.strategy.Strategy``
and sits between what the Flower server receives in a fit round and what leaves it
(``aggregate_fit``'s return value). The Message-API twin is
:class:`fedmem.flower.message_api.GatewayStrategy`; both delegate every decision, the
release and the booking to one :class:`fedmem.flower.core.GatewayCore`.

**What the Flower server sees in a fit round** (``aggregate_fit`` arguments, also with
``SecAggPlusWorkflow``): the sampled node set, which nodes replied and which failed (the
*reply set*), every reply's ``num_examples`` and ``metrics`` in plaintext, and the
replies' vectors (with SecAgg+: every result carries the aggregate). Channels:

=====================  ===========================================================  ============
channel                when                                                          kind
=====================  ===========================================================  ============
``reply_set``          sampled by the client manager (data-independent); a reply     public
                       set != sampled set is a fault and fails closed
``num_examples``       ``public_num_examples`` (required: the client contract)       public
``metrics:client``     only ``public_metric_keys``; never forwarded                  public
``metrics:aggregated`` the inner strategy's aggregated metrics: never forwarded     (withheld)
``value``              the release below                                             dp
=====================  ===========================================================  ============

**The wrapped strategy is post-processing** (``dp="fedmem"``, the default when
``noise_multiplier`` is given). The wrapper itself computes the release whose sensitivity
it books: the sum of the replies' vectors (unweighted; every weight is the public
constant), plus exact discrete Gaussian noise of std ``noise_multiplier * sensitivity``
on a public grid (``sampling="secure"``, :mod:`fedmem.dp.samplers`), divided by the public
``num_sampled_clients``. Only this noised mean reaches the wrapped strategy, as **one**
``FitRes`` (``num_examples = public_num_examples``, no metrics). FedAvg returns it,
FedMedian of one value is that value, FedAdam takes a server step from it: whatever the
wrapped strategy computes is a function of the booked release, so it cannot change the
privacy cost, and its own view (what its ``aggregate_fit`` receives) is that release.
(The previous wrapper handed the inner strategy the raw replies and noised its output at
a mean's calibration: FedMedian inside it leaked, AUC 1.0.)

**dp="flower"** (Flower's ``DifferentialPrivacy{Client,Server}SideFixedClipping`` inside):
Flower adds ``N(0, (sigma_f C_f / m)^2)`` to the mean its inner strategy computes from the
raw replies, with numpy's *float* sampler on the global RNG (not injectable; its low bits
are not DP, Mironov 2012: reports label it "not DP (float sampler)"). The wrapper books
``GaussianDpEvent(sigma_f C_f / sensitivity)``, which is right only if the strategy inside
Flower's wrapper computes the unweighted mean: construction refuses anything else (only
Flower's ``FedAvg`` itself, or a strategy declaring ``fedmem_mean_aggregate = True``).
The strategy inside Flower's wrapper sees the exact replies (the server is trusted for the
value there); prefer ``dp="fedmem"``.

**Decisions, from public state only**: ``configure_fit`` decides (plan bookable, budget
fits, counting the rounds other wrappers on the same store admitted and have not booked)
before any client computes; else it returns ``[]`` (Flower cancels the round).
``aggregate_fit`` fails closed (``(None, {})``: nothing released, nothing booked) on any
fault or broken contract: failures, a reply set different from the sampled set, a
``num_examples`` other than the declared constant, an undeclared metric key, a reply that
is not float, not finite, too large, of another shape or (``clipping="client"``) above the
sensitivity; and on ANY exception while deciding, checking, releasing or booking (the audit
keeps ``"<stage>_error:<type>"``, never the text). Every reply is clipped to
``sensitivity`` on the server (``clipping="server"``, the default). The release is computed
and booked (per principal and in total, one SQLite transaction) **before** the wrapped
strategy or the caller sees it; if booking fails nothing is released. Configuration that could never
admit a round raises ``ValueError`` at construction (no ``public_num_examples``, no noise,
a budget below one round).

**What this cannot do in Flower 1.42** (docs/flower.md): the server process itself sees
the reply set, ``num_examples``, metrics and, with ``SecAggPlusWorkflow``, the exact
unmasked sum (central DP is added after unmasking); federated evaluation is not gated and
is disabled by this wrapper (``configure_evaluate`` returns ``[]``).
"""

from __future__ import annotations



import numpy as np
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
    Strategy,
)

from fedmem import _validate as V
from fedmem.dp import Accountant
from fedmem.errors import BudgetExceeded
from fedmem.federation.aggregator import ReleasePlan
from fedmem.flower.core import GatewayCore, Refused, RoundRecord, error_code

DP_MODES = ("auto", "flower", "fedmem")
FLOWER_DP = (DifferentialPrivacyClientSideFixedClipping, DifferentialPrivacyServerSideFixedClipping)

__all__ = ["SupportGatewayStrategy", "RoundRecord", "find_flower_dp", "DP_MODES"]


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


def _is_mean_strategy(s) -> bool:
    """Flower's own FedAvg (not a subclass: a subclass may aggregate differently), or a strategy
    whose author declares ``fedmem_mean_aggregate = True`` (its aggregate is the unweighted mean)."""
    return type(s) is FedAvg or getattr(s, "fedmem_mean_aggregate", False) is True


class SupportGatewayStrategy(Strategy):
    """Wrap a Flower strategy so only booked or public channels leave a fit round (module doc).

    Parameters: ``strategy`` (the wrapped Flower strategy), ``accountant`` (fedmem
    :class:`~fedmem.dp.Accountant`: the total; per-principal accountants live in its store),
    ``num_sampled_clients`` (public m; every round must sample exactly m), ``dp``
    (``"auto"``: Flower's DP wrapper if one is inside, else fedmem's), ``noise_multiplier``
    and ``sensitivity`` (fedmem's release: noise std ``noise_multiplier * sensitivity`` on the
    sum), ``public_num_examples`` (required) and ``public_metric_keys`` (the client contract),
    ``epsilon_budget`` / ``total_epsilon_budget`` at ``delta`` (``math.inf`` disables),
    ``principal`` (the querying identity the budgets are charged to; default: a fresh one),
    ``rng`` (fedmem's noise; required for ``dp="fedmem"``), ``sampling`` (``"secure"``,
    the default; ``"fast"`` is numpy's float sampler and not DP), ``clipping`` (``"server"``, the
    default: every reply is clipped to L2 <= ``sensitivity`` by the wrapper; ``"client"``: a round
    with a reply above it is refused; :class:`fedmem.flower.core.GatewayCore`), ``clip_norm``
    (the per-reply L2 bound enforced; default ``sensitivity``; larger for record-level adjacency).
    """

    def __init__(self, strategy: Strategy, accountant: Accountant, *, num_sampled_clients: int,
                 dp: str = "auto", noise_multiplier: float | None = None, sensitivity: float | None = None,
                 public_num_examples: int | None = None, public_metric_keys=(),
                 epsilon_budget: float = 10.0, total_epsilon_budget: float = 100.0, delta: float = 1e-6,
                 principal: str | None = None, rng: np.random.Generator | None = None,
                 sampling: str = "secure", clipping: str = "server", clip_norm: float | None = None) -> None:
        super().__init__()
        if not isinstance(strategy, Strategy):
            hint = (" (a Message-API strategy: use fedmem.flower.GatewayStrategy)"
                    if type(strategy).__module__.startswith("flwr.serverapp") else "")
            raise TypeError(f"strategy must be a flwr.server.strategy.Strategy{hint}. "
                            f"Found {type(strategy).__name__}.")
        self.strategy = strategy
        if dp not in DP_MODES:
            raise ValueError(f"dp must be one of {DP_MODES}. Found {dp!r}.")
        flower_dp = find_flower_dp(strategy)
        if dp == "auto":
            dp = "flower" if flower_dp is not None else "fedmem"
        self.dp = dp
        if dp == "flower":
            if flower_dp is None:
                raise ValueError("dp='flower' needs a Flower DifferentialPrivacy*FixedClipping wrapper inside "
                                 f"strategy. Found {type(strategy).__name__} without one.")
            if noise_multiplier is not None:
                raise ValueError(f"noise_multiplier must be None with dp='flower' (Flower's wrapper adds the noise). "
                                 f"Found {noise_multiplier!r}.")
            if not _is_mean_strategy(flower_dp.strategy):
                raise ValueError(
                    f"strategy: dp='flower' books Flower's noise for an unweighted mean, but the strategy inside "
                    f"Flower's DP wrapper is {type(flower_dp.strategy).__name__}, whose sensitivity this wrapper "
                    f"cannot book. Fix: use dp='fedmem' (the wrapper noises the sum itself and any strategy is "
                    f"post-processing), or put Flower's FedAvg inside Flower's DP wrapper.")
            if flower_dp.num_sampled_clients != num_sampled_clients:
                raise ValueError(f"num_sampled_clients must equal the Flower DP wrapper's "
                                 f"({flower_dp.num_sampled_clients}). Found {num_sampled_clients!r}.")
            if float(flower_dp.noise_multiplier) <= 0:
                raise ValueError(f"noise_multiplier of Flower's DP wrapper must be positive (no noise: every round "
                                 f"would be refused). Found {flower_dp.noise_multiplier!r}.")
            sens = float(flower_dp.clipping_norm) if sensitivity is None else V.positive("sensitivity", sensitivity)
            # Flower: N(0, (sigma_f C_f / m)^2) on the mean of m equal-weight replies = sigma_f C_f on the sum.
            mult = float(flower_dp.noise_multiplier) * float(flower_dp.clipping_norm) / sens
            sampling = "fast"    # numpy's float sampler inside Flower (not DP in its low bits)
            mode = "external"
        else:
            mult, sens, mode = noise_multiplier, sensitivity, "fedmem"
        self.core = GatewayCore(accountant, num_sampled_clients=num_sampled_clients, noise_multiplier=mult,
                                sensitivity=sens, public_num_examples=public_num_examples,
                                public_metric_keys=public_metric_keys, epsilon_budget=epsilon_budget,
                                total_epsilon_budget=total_epsilon_budget, delta=delta, principal=principal,
                                rng=rng, sampling=sampling, mode=mode, label="flower", clipping=clipping,
                                clip_norm=clip_norm)

    # ------------------------------------------------------------------ the core's state, by name
    gateway = property(lambda self: self.core.gateway)
    principal = property(lambda self: self.core.principal)
    audit = property(lambda self: self.core.audit)
    plan = property(lambda self: self.core.plan)
    multiplier = property(lambda self: self.core.multiplier)
    sensitivity = property(lambda self: self.core.sensitivity)
    num_sampled_clients = property(lambda self: self.core.num_sampled_clients)
    public_num_examples = property(lambda self: self.core.public_num_examples)
    public_metric_keys = property(lambda self: self.core.public_metric_keys)
    delta = property(lambda self: self.core.delta)
    sampling = property(lambda self: self.core.sampling)
    rng = property(lambda self: self.core.rng)

    @property
    def noise_std_on_sum(self) -> float:
        return self.core.noise_std_on_sum

    @noise_std_on_sum.setter
    def noise_std_on_sum(self, value: float) -> None:
        self.core.noise_std_on_sum = float(value)

    def round_plan(self) -> ReleasePlan:
        return self.core.round_plan()

    @property
    def epsilon_per_round(self) -> float:
        """Epsilon at ``delta`` of one admitted round (the accountant's, for one event)."""
        return self.core.epsilon_per_round

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
    def _contract_faults(self, sampled: set, results, failures) -> list[str]:
        shapes = [[a.shape for a in parameters_to_ndarrays(res.parameters)] for _, res in results]
        return self.core.contract_faults(sampled, [p.node_id for p, _ in results],
                                         [res.num_examples for _, res in results],
                                         [(res.metrics or {}).keys() for _, res in results], shapes, len(failures))

    def _release(self, server_round: int, results, failures):
        """The booked value, not yet seen by anyone. dp='fedmem': the core's noised mean of the checked,
        clipped replies (a list of ndarrays). dp='flower': Flower's DP wrapper aggregates the checked,
        clipped replies and adds its noise (its inner strategy sees those replies: documented)."""
        replies = [parameters_to_ndarrays(res.parameters) for _, res in results]
        if self.dp == "flower":
            clipped = self.core.clipped(replies)
            results = [(proxy, FitRes(res.status, ndarrays_to_parameters(arrs), res.num_examples, res.metrics))
                       for (proxy, res), arrs in zip(results, clipped)]
            return self.strategy.aggregate_fit(server_round, results, failures)[0]
        return self.core.release(replies)

    def _inner_aggregate(self, server_round: int, results, released):
        """The wrapped strategy's aggregate of the booked release, handed to it as ONE FitRes
        (post-processing; dp='fedmem'). dp='flower': Flower's wrapper already aggregated."""
        if self.dp == "flower":
            return released
        one = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(released), self.public_num_examples, {})
        return self.strategy.aggregate_fit(server_round, [(results[0][0], one)], [])[0]

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        try:
            decision = self.core.decide(server_round)
        except Exception as exc:     # fail closed without values: the type only, in the audit
            self.core.close()
            self.audit.append(RoundRecord(server_round, None, "fault", (error_code("decide", exc),)))
            return []
        if not decision.admitted:
            return []
        instructions = self.strategy.configure_fit(server_round, parameters, client_manager)
        if len(instructions) != self.num_sampled_clients:
            self.core.refuse(server_round, decision, ("sampled_count",), sampled=len(instructions))
            return []
        self.core.open(server_round, decision, [proxy.node_id for proxy, _ in instructions])
        return instructions

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures) -> tuple[Parameters | None, dict[str, Scalar]]:
        opened = self.core.take(server_round)
        if opened is None:        # refused in configure_fit (or never configured): nothing leaves
            return None, {}
        decision, sampled = opened
        rec = RoundRecord(server_round, decision.query_id, "fault", sampled=len(sampled), replied=len(results),
                          failures=len(failures), channels=tuple(c.name for c in self.plan.channels))
        self.audit.append(rec)
        stage = "contract"
        try:
            reasons = self._contract_faults(sampled, results, failures)
            if reasons:
                rec.reasons = tuple(reasons)
                if "num_examples" in reasons:
                    rec.detail["num_examples"] = sorted({int(res.num_examples) for _, res in results})
                return None, {}
            stage = "release"
            released = self._release(server_round, results, failures)
            if released is None:
                rec.reasons = ("no_aggregate",)
                return None, {}
            stage = "book"
            try:
                self.core.book(server_round, decision, rec)
            except BudgetExceeded:
                rec.reasons = ("epsilon_budget",)
                return None, {}
        except Refused as r:
            rec.reasons = r.reasons
            return None, {}
        except Exception as exc:     # fail closed without values: the type only, in the audit
            rec.decision, rec.reasons = "fault", (error_code(stage, exc),)
            return None, {}
        finally:
            self.core.close()
        # booked: only now does anyone (the wrapped strategy, the caller) see the release
        return self._inner_aggregate(server_round, results, released), {}
