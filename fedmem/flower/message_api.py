"""fedmem's gateway for Flower's Message API (``flwr.serverapp.strategy``, Flower 1.42).

:class:`GatewayStrategy` wraps any ``flwr.serverapp.strategy.Strategy`` the way Flower's own
``DifferentialPrivacyClientSideFixedClipping`` does (same hook names: ``configure_train``,
``aggregate_train``, ``configure_evaluate``, ``aggregate_evaluate``, ``summary``,
``privacy_spent``; the same accountant conventions: ``would_exceed`` before a round,
``compose`` after a successful release, :class:`flwr.serverapp.exception.PrivacyBudgetExhausted`
when the budget refuses, an INFO line per round through Flower's logger). Every
decision, the release and the booking come from the same
:class:`fedmem.flower.core.GatewayCore` as the legacy
:class:`fedmem.flower.gateway.SupportGatewayStrategy`:

* ``configure_train``: admission from public state (the round's Gaussian event must fit
  fedmem's per-principal and total budgets, and a Flower ``PrivacyAccountant``'s
  ``max_epsilon`` if one is given); refused -> ``PrivacyBudgetExhausted`` (the run stops,
  as with Flower's wrappers). The wrapped strategy then samples; a sample of any size
  other than ``num_sampled_clients`` raises ``ValueError`` (Flower's convention).
* ``aggregate_train``: fails closed (``(None, None)``, nothing booked) on error replies,
  a reply set different from the sampled set, a weight (the wrapped strategy's
  ``weighted_by_key``, default ``"num-examples"``) other than ``public_num_examples``, an
  undeclared metric key, more than one ArrayRecord/MetricRecord, or differing shapes.
  Else the core computes the noised sum of the replies' arrays (exact discrete Gaussian,
  ``sampling="secure"``), divides by ``num_sampled_clients`` and hands the wrapped
  strategy **one** reply carrying that noised mean (weight ``public_num_examples``): the
  wrapped strategy (FedAvg, FedMedian, FedAdam, yours) is post-processing. Its aggregated
  metrics are withheld. The round is booked (fedmem ledger, and the Flower accountant if
  given) **before** the wrapped strategy, the server log or the caller sees the release; a
  booking that fails releases nothing. Replies are checked and clipped on the server first
  (:meth:`fedmem.flower.core.GatewayCore.prepare`), and any exception in the decision,
  checks, release or booking is the uniform refusal (no aggregate, a value-free reason code
  in the audit).
* Federated evaluation is not gated and is disabled (``configure_evaluate`` returns ``[]``).

Accountants: ``ledger`` is fedmem's durable :class:`fedmem.dp.Accountant` (default: an
in-memory RDP one); ``accountant`` is an optional Flower ``PrivacyAccountant``
(``RdpAccountant(PrivacyConfig(..., sampling_method=NO_AMPLIFICATION))``) the wrapper also
composes into (client-level, no amplification: fedmem books every sampled round in full).
``privacy_spent()`` returns Flower's ``PrivacySpent`` for fedmem's ledger.

Construction raises ``ValueError`` naming the argument and the fix for configurations
that could never admit a round: no ``public_num_examples``, no noise, a budget (fedmem's
or the Flower accountant's ``max_epsilon``) below one round, a Flower accountant with
amplification, a wrapped strategy that can never sample ``num_sampled_clients`` nodes
(``min_train_nodes`` above it, ``fraction_train == 0``).
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.exception import PrivacyBudgetExhausted
from flwr.serverapp.strategy import Strategy
from flwr.supercore import log

from fedmem.dp import Accountant
from fedmem.errors import BudgetExceeded
from fedmem.flower.core import GatewayCore, Refused, RoundRecord, error_code

__all__ = ["GatewayStrategy"]


class GatewayStrategy(Strategy):
    """Wrap a Message-API strategy: only a booked, securely noised mean leaves a round (module doc).

    Parameters (as Flower's DP wrappers: ``strategy, noise_multiplier, clipping_norm,
    num_sampled_clients, *, accountant``): ``strategy``; ``noise_multiplier`` (noise std
    ``noise_multiplier * sensitivity`` on the sum); ``sensitivity`` (L2 change of one
    protected unit on the sum of the replies, by the client contract); ``num_sampled_clients``
    (public m); ``public_num_examples`` (required: every reply's weight); ``rng`` (injected
    noise RNG, required); ``accountant`` (optional Flower ``PrivacyAccountant``); ``ledger``
    (fedmem ``Accountant``; default in-memory RDP); ``epsilon_budget`` /
    ``total_epsilon_budget`` at ``delta``; ``principal``; ``public_metric_keys``;
    ``sampling`` (``"secure"``; ``"fast"`` is numpy's float sampler, not DP); ``clipping``
    (``"server"``, the default: the wrapper clips every reply to L2 <= ``sensitivity``, as
    Flower's ``DifferentialPrivacyServerSideFixedClipping``; ``"client"``: a round with a reply
    above it is refused, for clients that clip with :func:`fedmem.flower.mods.fixedclipping_mod`);
    ``clip_norm`` (the per-reply L2 bound enforced; default ``sensitivity``; larger for
    record-level adjacency, :class:`fedmem.flower.core.GatewayCore`).
    """

    def __init__(self, strategy: Strategy, noise_multiplier: float, sensitivity: float, num_sampled_clients: int,
                 *, public_num_examples: int | None = None, rng: np.random.Generator | None = None,
                 accountant=None, ledger: Accountant | None = None, epsilon_budget: float = 10.0,
                 total_epsilon_budget: float = 100.0, delta: float = 1e-6, principal: str | None = None,
                 public_metric_keys=(), sampling: str = "secure", clipping: str = "server",
                 clip_norm: float | None = None) -> None:
        super().__init__()
        if not isinstance(strategy, Strategy):
            hint = (" (a legacy strategy: use fedmem.flower.SupportGatewayStrategy)"
                    if type(strategy).__module__.startswith("flwr.server.") else "")
            raise TypeError(f"strategy must be a flwr.serverapp.strategy.Strategy{hint}. "
                            f"Found {type(strategy).__name__}.")
        self.strategy = strategy
        self.weight_key = str(getattr(strategy, "weighted_by_key", "num-examples"))
        keys = frozenset(public_metric_keys) | {self.weight_key} if not isinstance(public_metric_keys, str) \
            else public_metric_keys
        self.core = GatewayCore(ledger if ledger is not None else Accountant("rdp"),
                                num_sampled_clients=num_sampled_clients, noise_multiplier=noise_multiplier,
                                sensitivity=sensitivity, public_num_examples=public_num_examples,
                                public_metric_keys=keys, epsilon_budget=epsilon_budget,
                                total_epsilon_budget=total_epsilon_budget, delta=delta, principal=principal,
                                rng=rng, sampling=sampling, mode="fedmem", label="flower-message",
                                clipping=clipping, clip_norm=clip_norm)
        self.accountant = accountant
        if accountant is not None:
            self._check_flower_accountant(accountant)
        frac = getattr(strategy, "fraction_train", None)
        if frac is not None and float(frac) == 0.0:
            raise ValueError(f"strategy.fraction_train must be > 0 (0 never samples a node, so no round is ever "
                             f"released). Fix: FedAvg(fraction_train=1.0, ...). Found {frac!r}.")
        mtn = getattr(strategy, "min_train_nodes", None)
        if isinstance(mtn, int) and mtn > self.core.num_sampled_clients:
            raise ValueError(f"num_sampled_clients must be >= the wrapped strategy's min_train_nodes ({mtn}): it "
                             f"always samples at least that many, and every round would be refused. Fix: "
                             f"num_sampled_clients={mtn} or a smaller min_train_nodes. "
                             f"Found {self.core.num_sampled_clients!r}.")
        self._instructions: dict[int, list[Message]] = {}

    # ------------------------------------------------------------------ accounting
    def _event(self):
        from flwr.supercore.privacy_accounting import GaussianPrivacyEvent

        m = self.core.num_sampled_clients
        pop = max(m, int(self.accountant.config.population_size)) if self.accountant is not None else m
        return GaussianPrivacyEvent(noise_multiplier=self.core.multiplier, sample_size=m, population_size=pop)

    def _check_flower_accountant(self, acc) -> None:
        from flwr.supercore.privacy_accounting import SamplingMethod

        cfg = getattr(acc, "config", None)
        if cfg is None or not all(hasattr(acc, n) for n in ("compose", "would_exceed", "get_privacy_spent")):
            raise ValueError(f"accountant must be a Flower PrivacyAccountant (config, compose, would_exceed, "
                             f"get_privacy_spent). Found {type(acc).__name__}.")
        if cfg.sampling_method is not SamplingMethod.NO_AMPLIFICATION:
            raise ValueError(f"accountant: fedmem books every sampled round in full, so the Flower accountant "
                             f"must use sampling_method='no-amplification'. Fix: PrivacyConfig(..., "
                             f"sampling_method=SamplingMethod.NO_AMPLIFICATION). Found {cfg.sampling_method.value!r}.")
        if cfg.population_size < self.core.num_sampled_clients:
            raise ValueError(f"accountant: population_size must be >= num_sampled_clients "
                             f"({self.core.num_sampled_clients}). Found {cfg.population_size!r}.")
        if cfg.max_epsilon is not None and acc.num_releases == 0 and acc.would_exceed(self._event()):
            raise ValueError(f"accountant: its max_epsilon must allow one round (epsilon "
                             f"{self.core.epsilon_per_round:.4g} at delta {self.core.delta:g}). Fix: raise "
                             f"max_epsilon or noise_multiplier. Found max_epsilon={cfg.max_epsilon!r}.")

    def privacy_spent(self):
        """Flower's ``PrivacySpent`` of fedmem's ledger for this principal (at ``delta``)."""
        from flwr.supercore.privacy_accounting import PrivacySpent

        acc = self.core.gateway.principal_accountant(self.core.principal)
        return PrivacySpent(epsilon=self.core.spent(), delta=self.core.delta, num_releases=acc.count,
                            accounting_method=f"fedmem-{acc.kind}")

    # ------------------------------------------------------------------ the core's state, by name
    gateway = property(lambda self: self.core.gateway)
    principal = property(lambda self: self.core.principal)
    audit = property(lambda self: self.core.audit)
    epsilon_per_round = property(lambda self: self.core.epsilon_per_round)

    def __repr__(self) -> str:
        return (f"GatewayStrategy(strategy={self.strategy!r}, noise_multiplier={self.core.multiplier:g}, "
                f"sensitivity={self.core.sensitivity:g}, num_sampled_clients={self.core.num_sampled_clients}, "
                f"sampling={self.core.sampling!r})")

    def summary(self) -> None:
        log(INFO, "\t├──> fedmem gateway (inner strategy is post-processing of a booked release):")
        log(INFO, "\t│\t├── Noise multiplier: %s (sampling=%s)", self.core.multiplier, self.core.sampling)
        log(INFO, "\t│\t├── Sensitivity on the sum: %s", self.core.sensitivity)
        log(INFO, "\t│\t├── Public num_examples: %s, sampled clients: %s", self.core.public_num_examples,
            self.core.num_sampled_clients)
        log(INFO, "\t│\t└── Epsilon per round: %.4f at delta %g", self.core.epsilon_per_round, self.core.delta)
        self.strategy.summary()

    # ------------------------------------------------------------------ train
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        try:
            decision = self.core.decide(server_round)
        except Exception as exc:     # fail closed without values: no round, the type only in the audit
            self.core.close()
            self.core.audit.append(RoundRecord(server_round, None, "fault", (error_code("decide", exc),)))
            log(WARNING, "fedmem gateway: round %d fault: nothing sent, nothing released", server_round)
            return []
        if not decision.admitted:
            spent = self.core.spent()
            log(INFO, "fedmem gateway: round %d refused (%s); epsilon spent %.4f at delta %g", server_round,
                ",".join(decision.reasons), spent, self.core.delta)
            raise PrivacyBudgetExhausted(f"The next private release would exceed the fedmem budget "
                                         f"({','.join(decision.reasons)}; current epsilon: {spent}, delta: "
                                         f"{self.core.delta}).")
        if (self.accountant is not None and self.accountant.config.max_epsilon is not None
                and self.accountant.would_exceed(self._event())):
            self.core.refuse(server_round, decision, ("flower_accountant",))
            sp = self.accountant.get_privacy_spent()
            raise PrivacyBudgetExhausted(f"The next private release would exceed max_epsilon (current epsilon: "
                                         f"{sp.epsilon}, delta: {sp.delta}).")
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        if len(messages) != self.core.num_sampled_clients:
            self.core.refuse(server_round, decision, ("sampled_count",), sampled=len(messages))
            raise ValueError(f"The configured sample size does not match num_sampled_clients: {len(messages)} != "
                             f"{self.core.num_sampled_clients}.")
        self.core.open(server_round, decision, [m.metadata.dst_node_id for m in messages])
        self._instructions[server_round] = messages
        return messages

    def _faults(self, sampled: set, replies: list[Message]) -> tuple[list[str], list]:
        ok = [m for m in replies if not m.has_error()]
        errors = len(replies) - len(ok)
        weights, metric_keys, shapes, arrays, extra = [], [], [], [], []
        for m in ok:
            c = m.content
            if len(c.array_records) != 1 or len(c.metric_records) > 1 or len(c.config_records):
                extra.append("records")
                continue
            (akey, arec), = c.array_records.items()
            mrec = next(iter(c.metric_records.values())) if c.metric_records else {}
            weights.append(mrec.get(self.weight_key))
            metric_keys.append(list(mrec.keys()))
            nd = arec.to_numpy_ndarrays()
            shapes.append([(k, a.shape) for k, a in zip(arec.keys(), nd)])
            arrays.append((akey, list(arec.keys()), nd))
        reasons = self.core.contract_faults(sampled, [m.metadata.src_node_id for m in ok], weights, metric_keys,
                                            shapes, errors)
        if extra:
            reasons.append("records")
        return reasons, arrays

    def _inner_view(self, server_round: int, arrays, noised) -> Message:
        """One reply carrying the booked noised mean (the only thing the wrapped strategy sees)."""
        akey, names, _ = arrays[0]
        content = RecordDict({akey: ArrayRecord(dict(zip(names, (Array(np.asarray(a)) for a in noised)))),
                              "metrics": MetricRecord({self.weight_key: self.core.public_num_examples})})
        return Message(content, reply_to=self._instructions[server_round][0])

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        opened = self.core.take(server_round)
        if opened is None:
            self._instructions.pop(server_round, None)
            return None, None
        decision, sampled = opened
        rec = RoundRecord(server_round, decision.query_id, "fault", sampled=len(sampled),
                          replied=sum(not m.has_error() for m in replies),
                          failures=sum(m.has_error() for m in replies),
                          channels=tuple(c.name for c in self.core.plan.channels))
        self.core.audit.append(rec)
        stage = "contract"
        try:
            reasons, arrays = self._faults(sampled, replies)
            if reasons:
                rec.reasons = tuple(reasons)
                if "num_examples" in reasons:
                    rec.detail["num_examples"] = self._weights_found(replies)
                return self._refusal(server_round, rec)
            stage = "release"
            released = self._release(server_round, replies, arrays)
            stage = "book"
            try:
                self.core.book(server_round, decision, rec)
            except BudgetExceeded:
                rec.reasons = ("epsilon_budget",)
                return self._refusal(server_round, rec)
            if self.accountant is not None:
                self.accountant.compose(self._event())
        except Refused as r:
            rec.reasons = r.reasons
            return self._refusal(server_round, rec)
        except Exception as exc:     # fail closed without values: the type only, in the audit
            rec.decision, rec.reasons = "fault", (error_code(stage, exc),)
            return self._refusal(server_round, rec)
        finally:
            self._instructions.pop(server_round, None)
            self.core.close()
        # booked: only now do the server log and the wrapped strategy (post-processing) see the release
        acc = self.core.gateway.principal_accountant(self.core.principal)
        log(INFO, "fedmem gateway: round %d admitted; privacy spent: epsilon=%.6f at delta=%g after %d "
            "releases", server_round, rec.epsilon_booked, self.core.delta, acc.count)
        return self._hand_out(server_round, released), None

    def _release(self, server_round: int, replies: list[Message], arrays) -> Message:
        """The booked value, not yet seen by anyone: one reply carrying the core's noised mean of the
        checked, clipped replies."""
        return self._inner_view(server_round, arrays, self.core.release([nd for _, _, nd in arrays]))

    def _hand_out(self, server_round: int, released: Message):
        """After booking: the wrapped strategy's aggregate of the one noised reply (post-processing;
        its aggregated metrics are withheld)."""
        agg, _withheld = self.strategy.aggregate_train(server_round, [released])
        return agg

    def _weights_found(self, replies) -> list:
        """The weights the replies carried (operator's audit detail of a num_examples fault)."""
        out = set()
        for m in replies:
            if not m.has_error():
                for rec in m.content.metric_records.values():
                    v = rec.get(self.weight_key)
                    out.add(v if isinstance(v, (int, float)) else None)
        return sorted(out, key=lambda v: (v is None, v if v is not None else 0))

    def _refusal(self, server_round: int, rec: RoundRecord):
        """The uniform refusal: no aggregate; one value-free log line (the reason codes)."""
        log(WARNING, "fedmem gateway: round %d %s (%s): nothing released, nothing booked", server_round,
            rec.decision, ",".join(rec.reasons))
        return None, None

    # ------------------------------------------------------------------ evaluate (not gated: disabled)
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None
