"""The wrapped Flower strategy is post-processing of the release the gateway books.

The gateway computes the noised sum of the replies itself (exact discrete Gaussian on a
public grid) and hands the wrapped strategy only the noised mean. So FedMedian and FedAdam
inside it audit "within booked" by the one verdict rule (:func:`fedmem.attacks.verdict.judge`),
and the previous behaviour (the wrapped strategy aggregates the raw replies, the wrapper
noises its output at a mean's calibration) is caught as a LEAK by the SAME test.

Neighbouring worlds: client 0's reply moves by one unit of sensitivity (L2 1.0, spread
over the coordinates). The other clients sit at -10 / +10, so client 0 is the coordinate
median: FedMedian's output moves by the full unit (a mean's by 1/M), and FedAdam's server
step flips sign with the mean. Both are audited from the released output and from the
wrapped strategy's own view (:class:`fedmem.flower.harness.Spy`).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedmem.attacks.verdict import judge  # noqa: E402
from fedmem.dp import Accountant  # noqa: E402
from fedmem.flower import SupportGatewayStrategy  # noqa: E402
from fedmem.flower.harness import Spy, legacy_round, message_round  # noqa: E402
from fedmem.flower.message_api import GatewayStrategy  # noqa: E402

M, D, SIGMA, DELTA, TRIALS = 21, 2, 4.0, 1e-6, 60
U = np.full(D, 1.0 / math.sqrt(D))          # one unit of sensitivity (L2 = 1) on client 0's reply


def _replies(world: int, centre: np.ndarray) -> list:
    others = [np.full(D, -10.0)] * ((M - 1) // 2) + [np.full(D, 10.0)] * ((M - 1) // 2)
    return [[centre + world * U]] + [[x] for x in others]


# ------------------------------------------------------------------ the inner strategies
def _legacy(name):
    from flwr.common import ndarrays_to_parameters
    from flwr.server.strategy import FedAdam, FedMedian

    init = ndarrays_to_parameters([np.zeros(D)])
    if name == "FedMedian":
        return FedMedian(min_fit_clients=M, min_available_clients=M, initial_parameters=init)
    return FedAdam(initial_parameters=init, eta=1.0, tau=1e-9, min_fit_clients=M, min_available_clients=M)


def _message(name):
    from flwr.serverapp.strategy import FedAdam, FedMedian

    if name == "FedMedian":
        return FedMedian(min_train_nodes=M, min_available_nodes=M)
    return FedAdam(eta=1.0, tau=1e-9, min_train_nodes=M, min_available_nodes=M)


# ------------------------------------------------------------------ the broken variants (old behaviour)
class _OldLegacy(SupportGatewayStrategy):
    """Hands the wrapped strategy the raw replies and noises its output at a mean's calibration
    (the wrapper's release hook, then handed out as is)."""

    def _release(self, server_round, results, failures):
        from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

        params, _ = self.strategy.aggregate_fit(server_round, results, failures)
        std = self.noise_std_on_sum / self.num_sampled_clients
        return ndarrays_to_parameters([a + self.rng.normal(0.0, std, size=a.shape)
                                       for a in parameters_to_ndarrays(params)])

    def _inner_aggregate(self, server_round, results, released):
        return released


class _OldMessage(GatewayStrategy):
    def _release(self, server_round, replies, arrays):
        from flwr.app import Array, ArrayRecord

        agg, _ = self.strategy.aggregate_train(server_round, [m for m in replies if not m.has_error()])
        std = self.core.noise_std_on_sum / self.core.num_sampled_clients
        return ArrayRecord({k: Array(np.asarray(a) + self.core.rng.normal(0.0, std, size=np.shape(a)))
                            for k, a in zip(agg.keys(), agg.to_numpy_ndarrays())})

    def _hand_out(self, server_round, released):
        return released


def _wrap(api, cls, inner):
    common = dict(public_num_examples=5, epsilon_budget=math.inf, total_epsilon_budget=math.inf, delta=DELTA,
                  rng=np.random.default_rng(7))
    if api == "legacy":
        return cls(inner, Accountant("rdp"), num_sampled_clients=M, dp="fedmem", noise_multiplier=SIGMA,
                   sensitivity=1.0, **common)
    return cls(inner, SIGMA, 1.0, M, **common)


def _audit(api, cls, name):
    """Scores (sum of the output's coordinates) on both worlds, from the release and from the
    wrapped strategy's view; judged against the epsilon booked for one round."""
    make = _legacy if api == "legacy" else _message
    gw = _wrap(api, cls, make(name))
    # FedAdam: the mean sits at -U/2 (world 0) or +U/2 (world 1): its server step flips sign with it.
    centre = -0.5 * U if name == "FedAdam" else np.zeros(D)
    out = {"release": ([], []), "wrapped strategy": ([], [])}
    rnd = 0
    for _ in range(TRIALS):
        for world in (1, 0):
            rnd += 1
            gw.strategy = make(name)                     # a fresh inner strategy per trial (FedAdam keeps state)
            spy = Spy(gw.strategy)
            run = legacy_round if api == "legacy" else message_round
            res, _ = run(gw, rnd, _replies(world, centre))
            assert res is not None
            out["release"][1 - world].append(float(np.sum(res[0])))
            view = spy.views[rnd]
            out["wrapped strategy"][1 - world].append(float(np.mean([np.sum(v[0]) for v in view])) if len(view) == 1
                                                      else float(np.sum(np.median([v[0] for v in view], axis=0))))
    booked = gw.epsilon_per_round
    return {k: judge(p, n, booked, DELTA, rng=np.random.default_rng(3)) for k, (p, n) in out.items()}, gw


@pytest.mark.parametrize("api, name", [("legacy", "FedMedian"), ("legacy", "FedAdam"), ("message", "FedMedian"),
                                       ("message", "FedAdam")])
def test_wrapped_strategy_is_post_processing_within_booked(api, name):
    verdicts, gw = _audit(api, SupportGatewayStrategy if api == "legacy" else GatewayStrategy, name)
    for observer, v in verdicts.items():
        assert v.label == "within booked", f"{api} {name} {observer}: {v.text}"
    assert len(gw.audit) == 2 * TRIALS and all(r.decision == "admitted" for r in gw.audit)


@pytest.mark.parametrize("api, name", [("legacy", "FedMedian"), ("legacy", "FedAdam"), ("message", "FedMedian")])
def test_old_wrapper_behaviour_is_caught_by_the_same_audit(api, name):
    verdicts, _ = _audit(api, _OldLegacy if api == "legacy" else _OldMessage, name)
    assert verdicts["release"].label == "LEAK", verdicts["release"].text
    assert verdicts["wrapped strategy"].label == "LEAK", verdicts["wrapped strategy"].text
