"""The hostile contributor: a ``malicious_client`` attack family against fedmem's Flower wrappers.

A ClientApp is code the server does not control: it may reply anything a Flower message can
carry. Each attack here is a two-world game on neighbouring rounds: an honest **target**
client replies ``0`` (world 0) or a contribution of L2 norm ``C`` (world 1: ``C e_1``, or a
random direction for the timing attack); the other honest clients reply ``0``; one
**malicious** client (node 0) replies what the attack chooses. The observer is everything
the querying side and the server operator's logs see of a round: whether it released, was
refused or raised, the released vector, the text of any exception and every line the wrapper
logged through Flower's logger, and (timing) how long the aggregation took. Each trial's
observation becomes a score; :func:`fedmem.attacks.verdict.judge` (the one verdict rule)
compares the scores of the two worlds with the epsilon one round books.

Attacks (:data:`ATTACKS`):

* ``range_limit_oracle`` (issue 37, measurement 1): the malicious reply is ``[L - C/2, 0, ...]``
  with ``L = 2**52 g`` the secure sampler's range limit on the release's grid ``g``, so the
  sum crosses the limit exactly when the target contributes. Score: the outcome (released /
  refused / raised) and any number in the texts near ``L`` (which would be the exact sum).
* ``non_finite``: the malicious reply is NaN (even trials) or +inf (odd trials).
* ``out_of_contract_norm``: the target itself breaks the contract: it replies ``0`` or a vector
  of norm ``500 C`` (a training ClientApp's raw weights). Score: the released first coordinate.
* ``release_timing`` (measurement 2): the target replies ``0`` or a random vector of norm ``C``
  (``dim`` coordinates), the malicious client a vector of spread exponents, the others fresh
  random vectors; the score is the smallest of ``repeats`` times of the wrapper's aggregation
  of that round (``aggregate_fit`` / ``aggregate_train``; ``clock="cpu"``, the server thread's
  CPU time, by default: the same value-dependent work as the wall time an outside observer
  reads, without the scheduler's noise, so the test keeps its power on a loaded machine;
  ``clock="wall"`` for the observer's own clock), the worlds interleaved in a random order in
  this one process, so background load hits both alike and the noise sampler's pool refills
  (every so many rounds) do not alias with a world. Either direction of the time difference
  counts (the verdict rule at ``alpha / 2`` on the scores and on their negation).

A row holds (:meth:`Row.holds`) when the verdict is not ``LEAK``, the round failed closed in
every trial (no exception escaped the wrapper, nothing booked when nothing was released) and no
text the observer saw carried the honest sum. Every row has a companion **broken variant**
(:data:`BROKEN`, a stand-in of the wrapper as it was before issue 37 with one defect switched
on: no server-side clipping, the ``math.fsum`` sum, exceptions out of ``aggregate_fit`` with
their text) that the same :meth:`Row.holds` must reject; ``tests/attacks/test_malicious_client.py``
and the ``flower.support_leak`` scenario's hostile-client table run both.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass, field

import numpy as np

from fedmem import _validate as V

__all__ = ["ATTACKS", "BROKEN", "Row", "run_attack", "make_gateway", "PreIssueGateway"]

ATTACKS = ("range_limit_oracle", "non_finite", "out_of_contract_norm", "release_timing")
#: attack -> the broken variant the same test must catch (PreIssueGateway's switches)
BROKEN = {
    "range_limit_oracle": {"clip": False, "fail_open": True},
    "non_finite": {"clip": False, "fail_open": True},
    "out_of_contract_norm": {"clip": False},
    "release_timing": {"fsum": True},
}
APIS = ("legacy", "message")
#: the timing attack's clock: the server thread's CPU time (the value-dependent work, without the
#: scheduler's noise from a loaded machine: more power) or the wall time an outside observer reads
CLOCKS = {"cpu": time.thread_time_ns, "wall": time.perf_counter_ns}
_NUM = re.compile(r"[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?")


@dataclass
class Row:
    attack: str
    variant: str                  # "fedmem" (the wrapper) or "broken: ..." (PreIssueGateway)
    api: str
    verdict: object               # fedmem.attacks.verdict.Verdict
    eps_booked: float
    trials: int
    released: tuple               # (world 0, world 1) rounds released
    escaped: int                  # trials whose exception left the wrapper
    booked_without_release: int   # trials that booked and released nothing
    values_in_text: int           # trials whose exception / log text carried the honest sum
    details: dict = field(default_factory=dict)

    def holds(self) -> bool:
        """No leak shown, failed closed in every trial, no value in any text."""
        from fedmem.attacks.verdict import is_leak

        return not is_leak(self.verdict) and self.escaped == 0 and self.booked_without_release == 0 \
            and self.values_in_text == 0

    def as_dict(self) -> dict:
        return {"attack": self.attack, "variant": self.variant, "api": self.api, "verdict": self.verdict.as_dict(),
                "verdict_text": self.verdict.text, "eps_booked": self.eps_booked, "trials": self.trials,
                "released": list(self.released), "escaped": self.escaped,
                "booked_without_release": self.booked_without_release, "values_in_text": self.values_in_text,
                "holds": self.holds(), **self.details}


# ----------------------------------------------------------------------------- the broken stand-in
def _pre_issue_class():
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

    from fedmem.dp.mechanisms import GaussianMechanism
    from fedmem.flower.core import RoundRecord, flatten, unflatten
    from fedmem.flower.gateway import SupportGatewayStrategy

    class PreIssueGateway(SupportGatewayStrategy):
        """The legacy wrapper with issue 37's defects, one switch each (a companion broken variant,
        never a deployment): ``clip=False`` (no server-side checks or clipping: the replies are
        summed as they come), ``fsum=True`` (``math.fsum`` per coordinate: value-dependent time),
        ``fail_open=True`` (an exception leaves ``aggregate_fit`` with its text, as the sampler's
        range error did with the exact sum in it)."""

        def __init__(self, *args, clip: bool = True, fsum: bool = False, fail_open: bool = False, **kw):
            super().__init__(*args, **kw)
            self.clip, self.fsum, self.fail_open = clip, fsum, fail_open

        def aggregate_fit(self, server_round, results, failures):
            opened = self.core.take(server_round)
            if opened is None:
                return None, {}
            decision, sampled = opened
            rec = RoundRecord(server_round, decision.query_id, "fault", sampled=len(sampled), replied=len(results))
            self.audit.append(rec)
            core = self.core
            try:
                replies = [parameters_to_ndarrays(r.parameters) for _, r in results]
                if self.clip:
                    reasons, mat, shapes = core.prepare(replies)
                    if reasons:
                        rec.reasons = tuple(reasons)
                        return None, {}
                else:
                    shapes = [a.shape for a in replies[0]]
                    mat = np.stack([flatten(a)[0] for a in replies])
                    if not np.all(np.isfinite(mat)):
                        raise ValueError("replies must be finite. Found a non-finite entry.")
                if self.fsum:
                    total = np.array([math.fsum(col) for col in mat.T], dtype=np.float64)
                else:
                    total = core.fixed_point_sum(mat).astype(np.float64) * core.grid
                mech = GaussianMechanism(sigma=core.noise_std_on_sum, l2_sensitivity=core.sensitivity)
                g = core.grid
                if np.any(np.abs(np.round(total / g) * g) >= math.ldexp(g, 52)):
                    # the sampler's range error as it read before issue 37: it named the value (the exact sum)
                    raise ValueError(f"value is too large for exact secure release on the grid {g!r} (scale "
                                     f"{core.noise_std_on_sum!r}): |value| must stay below {math.ldexp(g, 52)!r}. "
                                     f"Found {float(np.max(np.abs(total)))!r}.")
                noised = mech.release(total, core.rng, sampling=core.sampling)
                core.book(server_round, decision, rec)
            except Exception:
                if self.fail_open:
                    raise
                rec.reasons = ("error",)
                return None, {}
            finally:
                core.close()
            one = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(unflatten(noised / core.num_sampled_clients,
                                                                               shapes)), core.public_num_examples, {})
            return self.strategy.aggregate_fit(server_round, [(results[0][0], one)], [])[0], {}

    return PreIssueGateway


def __getattr__(name):
    if name == "PreIssueGateway":
        return _pre_issue_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_gateway(api: str = "legacy", *, num_sampled_clients: int = 3, noise_multiplier: float = 4.0,
                 sensitivity: float = 1.0, clipping: str = "server", seed: int = 0, broken: dict | None = None,
                 delta: float = 1e-6):
    """A wrapper with unlimited budgets for the games: fedmem's (``broken=None``, either API) or the
    pre-issue stand-in with the switches ``broken`` (legacy API only)."""
    if api not in APIS:
        raise ValueError(f"api must be one of {APIS}. Found {api!r}.")
    m = V.positive_int("num_sampled_clients", num_sampled_clients, minimum=1)
    common = dict(public_num_examples=5, epsilon_budget=math.inf, total_epsilon_budget=math.inf, delta=delta,
                  rng=np.random.default_rng(seed), clipping=clipping)
    if broken is not None:
        if api != "legacy":
            raise ValueError(f"api must be 'legacy' for a broken variant (PreIssueGateway). Found {api!r}.")
        from flwr.server.strategy import FedAvg

        from fedmem.dp import Accountant

        return _pre_issue_class()(FedAvg(min_fit_clients=m, min_available_clients=m), Accountant("rdp"),
                                  num_sampled_clients=m, dp="fedmem", noise_multiplier=noise_multiplier,
                                  sensitivity=sensitivity, **broken, **common)
    if api == "message":
        from flwr.serverapp.strategy import FedAvg

        from fedmem.flower.message_api import GatewayStrategy

        return GatewayStrategy(FedAvg(min_train_nodes=m, min_available_nodes=m), noise_multiplier, sensitivity, m,
                               **common)
    from flwr.server.strategy import FedAvg

    from fedmem.dp import Accountant
    from fedmem.flower.gateway import SupportGatewayStrategy

    return SupportGatewayStrategy(FedAvg(min_fit_clients=m, min_available_clients=m), Accountant("rdp"),
                                  num_sampled_clients=m, dp="fedmem", noise_multiplier=noise_multiplier,
                                  sensitivity=sensitivity, **common)


# ----------------------------------------------------------------------------- one observed round
class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@dataclass
class _Seen:
    out: list | None
    error: str | None
    lines: list
    booked: float
    seconds: float


def _observe(strategy, server_round: int, replies, *, clock=time.thread_time_ns) -> _Seen:
    """Configure a round, then aggregate ``replies`` (one list of arrays per sampled client, dtypes
    kept) the way Flower's server loop does; what the observer sees of it."""
    handler = _Lines()
    flwr_log = logging.getLogger("flwr")
    flwr_log.addHandler(handler)
    before = strategy.core.spent()
    error, out, dt = None, None, 0.0
    try:
        if hasattr(strategy, "aggregate_train"):
            agg_call, args = _message_args(strategy, server_round, replies)
        else:
            agg_call, args = _legacy_args(strategy, server_round, replies)
        t0 = clock()
        try:
            res = agg_call(*args)
        except Exception as exc:       # the observer sees the exception that left the wrapper
            error = f"{type(exc).__name__}: {exc}"
            res = None
        dt = (clock() - t0) * 1e-9
        if res is not None and res[0] is not None:
            from flwr.common import Parameters, parameters_to_ndarrays

            r0 = res[0]
            out = parameters_to_ndarrays(r0) if isinstance(r0, Parameters) else r0.to_numpy_ndarrays()
    finally:
        flwr_log.removeHandler(handler)
    return _Seen(out, error, handler.lines, strategy.core.spent() - before, dt)


def _legacy_args(strategy, server_round, replies):
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    from fedmem.flower.harness import FakeClientManager

    ins = strategy.configure_fit(server_round, ndarrays_to_parameters([np.zeros(1)]), FakeClientManager(len(replies)))
    results = [(proxy, FitRes(Status(Code.OK, ""), ndarrays_to_parameters([np.asarray(a) for a in arrays]), 5, {}))
               for (proxy, _), arrays in zip(ins, replies)]
    return strategy.aggregate_fit, (server_round, results, [])


def _message_args(strategy, server_round, replies):
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    from fedmem.flower.harness import FakeGrid, _identity

    _identity()
    msgs = list(strategy.configure_train(server_round, ArrayRecord([np.zeros(1)]), ConfigRecord(),
                                         FakeGrid(len(replies))))
    out = [Message(RecordDict({"arrays": ArrayRecord([np.asarray(a) for a in arrays]),
                               "metrics": MetricRecord({"num-examples": 5})}), reply_to=m)
           for m, arrays in zip(msgs, replies)]
    return strategy.aggregate_train, (server_round, out)


def _texts(seen: _Seen) -> list[str]:
    return ([seen.error] if seen.error else []) + list(seen.lines)


def _numbers(texts) -> list[float]:
    out = []
    for t in texts:
        for tok in _NUM.findall(t):
            try:
                out.append(float(tok))
            except ValueError:
                pass
    return out


# ----------------------------------------------------------------------------- the games
def _auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(a world-1 score > a world-0 score) + half the ties (Mann-Whitney), by ranks."""
    allv = np.r_[pos, neg]
    order = np.argsort(allv, kind="mergesort")
    ranks = np.empty(allv.size)
    sv = allv[order]
    i = 0
    while i < sv.size:            # average ranks of ties
        j = i
        while j + 1 < sv.size and sv[j + 1] == sv[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[:pos.size].sum() - pos.size * (pos.size + 1) / 2) / (pos.size * neg.size))


def _two_sided(judge, pos, neg, booked, delta, alpha, seed, mu_booked=None):
    """The verdict rule on the scores and on their negation, each at ``alpha / 2`` (the direction in which
    a channel separates the worlds is not known in advance); the worse of the two."""
    from fedmem.attacks.verdict import is_leak

    up = judge(pos, neg, booked, delta, alpha=alpha / 2, rng=np.random.default_rng(seed), mu_booked=mu_booked)
    down = judge(-pos, -neg, booked, delta, alpha=alpha / 2, rng=np.random.default_rng(seed), mu_booked=mu_booked)
    if is_leak(down) and not is_leak(up):
        return down
    return up if is_leak(up) or up.eps_lower >= down.eps_lower else down


def run_attack(attack: str, *, api: str = "legacy", trials: int = 200, broken: bool = False,
               num_sampled_clients: int = 3, noise_multiplier: float = 4.0, sensitivity: float = 1.0,
               clipping: str = "server", dim: int = 4, repeats: int = 5, seed: int = 0, alpha: float = 0.05,
               delta: float = 1e-6, clock: str = "cpu") -> Row:
    """Play ``attack`` for ``trials`` rounds per world against fedmem's wrapper (or, ``broken=True``,
    its companion broken variant :data:`BROKEN`) and judge it (module docstring)."""
    from fedmem.attacks.verdict import judge

    if attack not in ATTACKS:
        raise ValueError(f"attack must be one of {ATTACKS}. Found {attack!r}.")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {tuple(CLOCKS)}. Found {clock!r}.")
    tick = CLOCKS[clock]
    trials = V.positive_int("trials", trials, minimum=2)
    dim = V.positive_int("dim", dim, minimum=1)
    repeats = V.positive_int("repeats", repeats, minimum=1)
    m = V.positive_int("num_sampled_clients", num_sampled_clients, minimum=2)
    C = V.positive("sensitivity", sensitivity)
    switches = BROKEN[attack] if broken else None
    gw = make_gateway(api, num_sampled_clients=m, noise_multiplier=noise_multiplier, sensitivity=C,
                      clipping=clipping, seed=seed, broken=switches, delta=delta)
    g = gw.core.grid
    L = math.ldexp(g, 52)
    rng = np.random.default_rng([seed, 37])
    worlds = np.r_[np.zeros(trials, int), np.ones(trials, int)]
    rng.shuffle(worlds)
    scores = {0: [], 1: []}
    released = [0, 0]
    escaped = booked_wo = in_text = 0
    rnd = 0
    for i, w in enumerate(worlds):
        zero = np.zeros(dim)
        mal = zero.copy()
        target = zero.copy()
        if attack == "range_limit_oracle":
            mal[0] = L - C / 2
            target[0] = C * w
        elif attack == "non_finite":
            mal[0] = np.nan if i % 2 == 0 else np.inf
            target[0] = C * w
        elif attack == "out_of_contract_norm":
            target[0] = (500.0 * C + 0.123456789) * w     # an odd value: a copy of it in a text is no accident
        else:
            # the malicious reply spreads its exponents (so the target's bits decide how many partials an
            # exact float sum keeps); the other honest clients reply fresh random vectors in both worlds
            spread = rng.standard_normal(dim) * np.exp2(rng.integers(-30, 1, dim))
            mal = spread * (C / np.linalg.norm(spread))
            v = rng.standard_normal(dim)
            target = v * (C / np.linalg.norm(v)) if w else zero.copy()
        others = [zero.copy() for _ in range(m - 2)] if attack != "release_timing" else [
            (lambda u: u * (C / np.linalg.norm(u)))(rng.standard_normal(dim)) for _ in range(m - 2)]
        replies = [[mal], [target]] + [[o] for o in others]
        reps = repeats if attack == "release_timing" else 1
        seen_all = []
        for _ in range(reps):
            rnd += 1
            seen_all.append(_observe(gw, rnd, replies, clock=tick))
        seen = seen_all[0]
        for s in seen_all:
            escaped += s.error is not None
            booked_wo += s.out is None and s.booked > 0
            honest_sum = float(mal[0] + target[0])
            # the sum is identifiable in a text when it is not a small or whole number (round numbers, counts)
            if math.isfinite(honest_sum) and abs(honest_sum) >= 1 and honest_sum != round(honest_sum) and any(
                    abs(x - honest_sum) <= g for x in _numbers(_texts(s))):
                in_text += 1
        released[w] += seen.out is not None
        if attack == "release_timing":
            score = min(s.seconds for s in seen_all)
        elif attack == "out_of_contract_norm":
            score = float(seen.out[0].ravel()[0]) if seen.out is not None else -1e300
        else:
            code = 0.0 if seen.out is not None else (2.0 if seen.error else 1.0)
            near = [x for x in _numbers(_texts(seen)) if abs(x) >= L / 2]
            score = 3.0 + (max(near) - (L - C / 2)) / C if near else code
        scores[w].append(score)
    booked = gw.epsilon_per_round
    # one Gaussian event per round: exactly mu-GDP with mu = 1 / noise_multiplier (the whole-ROC test too)
    v = _two_sided(judge, np.asarray(scores[1], float), np.asarray(scores[0], float), booked, delta, alpha, seed,
                   mu_booked=1.0 / float(noise_multiplier))
    variant = "fedmem" if not broken else "broken: " + ", ".join(f"{k}={val}" for k, val in switches.items())
    details = {"clipping": clipping, "noise_multiplier": noise_multiplier, "num_sampled_clients": m, "dim": dim,
               "auc": _auc(np.asarray(scores[1], float), np.asarray(scores[0], float))}
    if attack == "release_timing":
        details.update(repeats=repeats, median_s=[float(np.median(scores[k])) for k in (0, 1)])
    return Row(attack, variant, api, v, booked, trials, tuple(released), escaped, booked_wo, in_text, details)


def main(argv=None) -> int:
    """``python -m fedmem.attacks.malicious_client ATTACK [--api legacy|message] [--broken] [--trials N] ...``:
    one row, printed as JSON (the measurements in docs/flower.md)."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m fedmem.attacks.malicious_client", description=main.__doc__)
    p.add_argument("attack", choices=ATTACKS)
    p.add_argument("--api", choices=APIS, default="legacy")
    p.add_argument("--broken", action="store_true", help="the companion broken variant (pre-issue-37 wrapper)")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--noise-multiplier", type=float, default=4.0)
    p.add_argument("--sensitivity", type=float, default=1.0)
    p.add_argument("--clipping", choices=("server", "client"), default="server")
    p.add_argument("--dim", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--clock", choices=tuple(CLOCKS), default="cpu")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:
        row = run_attack(a.attack, api=a.api, trials=a.trials, broken=a.broken, num_sampled_clients=a.clients,
                         noise_multiplier=a.noise_multiplier, sensitivity=a.sensitivity, clipping=a.clipping,
                         dim=a.dim, repeats=a.repeats, seed=a.seed, clock=a.clock)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    d = row.as_dict()
    print(json.dumps({k: d.get(k) for k in ("attack", "variant", "api", "verdict_text", "eps_booked", "trials",
                                            "released", "escaped", "values_in_text", "holds", "auc", "median_s")},
                     default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
