"""The Message-API gateway (Flower 1.42 ``flwr.serverapp.strategy``), its accountant
conventions and loud configuration errors, and the light ``import fedmem.flower``."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.serverapp.exception import PrivacyBudgetExhausted  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.supercore.privacy_accounting import (  # noqa: E402
    NeighboringRelation,
    PrivacyConfig,
    SamplingMethod,
)
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant  # noqa: E402

from fedmem.dp import Accountant  # noqa: E402
from fedmem.flower import GatewayStrategy, SupportGatewayStrategy  # noqa: E402
from fedmem.flower.core import epsilon_of  # noqa: E402
from fedmem.flower.harness import FakeGrid, message_round  # noqa: E402

M, D = 4, 3


def _replies(n=M):
    return [[np.full(D, 0.25 * i)] for i in range(n)]


def _gw(inner=None, **kw):
    args = dict(public_num_examples=5, rng=np.random.default_rng(0), epsilon_budget=math.inf,
                total_epsilon_budget=math.inf)
    args.update(kw)
    return GatewayStrategy(inner or FedAvg(min_train_nodes=M, min_available_nodes=M), 2.0, 1.0, M, **args)


def _flower_acc(max_epsilon=None, sampling=SamplingMethod.NO_AMPLIFICATION, population=M):
    return RdpAccountant(PrivacyConfig(target_delta=1e-6, population_size=population,
                                       neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                       sampling_method=sampling, max_epsilon=max_epsilon))


# ------------------------------------------------------------------ rounds, booking, log
def test_message_api_round_is_booked_logged_and_composed_into_flowers_accountant(caplog):
    acc = _flower_acc()
    ledger = Accountant("rdp")
    gw = _gw(accountant=acc, ledger=ledger)
    with caplog.at_level(logging.INFO, logger="flwr"):
        outs = [message_round(gw, r, _replies())[0] for r in (1, 2, 3)]
    assert all(o is not None and o[0].shape == (D,) for o in outs)
    one = epsilon_of(2.0, 1e-6)
    assert gw.epsilon_per_round == pytest.approx(one)
    spent = gw.privacy_spent()
    assert spent.num_releases == 3 and spent.epsilon == pytest.approx(epsilon_of(2.0, 1e-6, rounds=3))
    # fedmem's ledger and Flower's accountant agree (same RDP composition, no amplification)
    assert acc.num_releases == 3 and acc.get_privacy_spent().epsilon == pytest.approx(spent.epsilon, rel=1e-3)
    assert ledger.count == 3                          # the total, booked in the same transaction
    lines = [r.getMessage() for r in caplog.records if "fedmem gateway: round" in r.getMessage()]
    assert len(lines) == 3 and "admitted" in lines[-1] and f"epsilon={spent.epsilon:.6f}" in lines[-1]


def test_budget_refusal_raises_privacy_budget_exhausted_before_clients_compute():
    gw = _gw(epsilon_budget=epsilon_of(2.0, 1e-6) * 1.2)      # room for one round
    assert message_round(gw, 1, _replies())[0] is not None
    with pytest.raises(PrivacyBudgetExhausted):
        message_round(gw, 2, _replies())
    assert gw.audit[-1].decision == "refused" and gw.audit[-1].reasons == ("epsilon_budget",)
    assert gw.privacy_spent().num_releases == 1


def test_flower_accountant_max_epsilon_refuses_with_privacy_budget_exhausted():
    gw = _gw(accountant=_flower_acc(max_epsilon=epsilon_of(2.0, 1e-6) * 1.2))
    assert message_round(gw, 1, _replies())[0] is not None
    with pytest.raises(PrivacyBudgetExhausted, match="max_epsilon"):
        message_round(gw, 2, _replies())


@pytest.mark.parametrize("case", ["error", "weight", "metric"])
def test_message_api_round_fails_closed_on_a_broken_contract(case):
    gw = _gw()
    reps = _replies()
    kw = {}
    if case == "error":
        reps[1] = None
    elif case == "weight":
        kw["num_examples"] = [5, 6, 5, 5]
    else:
        kw["metrics"] = {"matches": 3}
    out, _ = message_round(gw, 1, reps, **kw)
    assert out is None and gw.privacy_spent().num_releases == 0
    assert gw.audit[-1].decision == "fault" and gw.audit[-1].reasons
    assert message_round(gw, 2, _replies())[0] is not None      # the next clean round is admitted


def test_sample_size_other_than_num_sampled_clients_raises():
    gw = _gw()
    with pytest.raises(ValueError, match="num_sampled_clients"):
        message_round(gw, 1, _replies(), grid=FakeGrid(M + 2))   # FedAvg samples all 6 connected nodes


# ------------------------------------------------------------------ loud configuration errors
@pytest.mark.parametrize("kw, name", [
    (dict(public_num_examples=None), "public_num_examples"),
    (dict(epsilon_budget=0.5), "epsilon_budget"),
    (dict(total_epsilon_budget=0.5), "total_epsilon_budget"),
    (dict(rng=None), "rng"),
    (dict(accountant="nope"), "accountant"),
    (dict(accountant=_flower_acc(max_epsilon=0.5)), "max_epsilon"),
    (dict(accountant=_flower_acc(sampling=SamplingMethod.POISSON, population=100)), "no-amplification"),
    (dict(sampling="float"), "sampling"),
])
def test_message_api_configuration_that_never_admits_raises_naming_the_argument(kw, name):
    with pytest.raises(ValueError, match=name) as e:
        _gw(**kw)
    assert "Found" in str(e.value)


def test_message_api_inner_strategy_that_can_never_sample_m_nodes_is_refused():
    with pytest.raises(ValueError, match="min_train_nodes"):
        _gw(FedAvg(min_train_nodes=M + 1))
    with pytest.raises(ValueError, match="fraction_train"):
        _gw(FedAvg(fraction_train=0.0))
    with pytest.raises(ValueError, match="noise_multiplier"):
        GatewayStrategy(FedAvg(), None, 1.0, M, public_num_examples=5, rng=np.random.default_rng(0))


def test_each_wrapper_names_the_other_for_the_wrong_api():
    from flwr.server.strategy import FedAvg as LegacyFedAvg

    with pytest.raises(TypeError, match="GatewayStrategy"):
        SupportGatewayStrategy(FedAvg(), Accountant("rdp"), num_sampled_clients=M, noise_multiplier=2.0,
                               sensitivity=1.0, public_num_examples=5, rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="SupportGatewayStrategy"):
        GatewayStrategy(LegacyFedAvg(), 2.0, 1.0, M, public_num_examples=5, rng=np.random.default_rng(0))


def test_legacy_flower_dp_mode_refuses_an_inner_strategy_it_cannot_book():
    from flwr.server.strategy import DifferentialPrivacyClientSideFixedClipping, FedMedian

    inner = DifferentialPrivacyClientSideFixedClipping(FedMedian(), noise_multiplier=1.0, clipping_norm=1.0,
                                                       num_sampled_clients=M)
    with pytest.raises(ValueError, match="FedMedian"):
        SupportGatewayStrategy(inner, Accountant("rdp"), num_sampled_clients=M, public_num_examples=5)


# ------------------------------------------------------------------ light import
# (``import fedmem.flower`` pulls no torch, CrypTen or Ray: checked in a fresh interpreter by
# tests/system/test_lazy_imports.py::test_fedmem_imports_no_heavy_module, the one subprocess for all import checks.)


# ------------------------------------------------------------------ audit harness (used by the tight audits)
@pytest.mark.parametrize("dp, api", [("fedmem", "legacy"), ("fedmem", "message"), ("flower", "legacy")])
def test_make_wrapped_runs_n_rounds_and_books_each(dp, api):
    from fedmem.flower.harness import make_wrapped, run_wrapped_rounds

    gw = make_wrapped(dp, api=api, num_sampled_clients=M, noise_multiplier=2.0, sensitivity=1.0,
                      flower_clipping_norm=1.0)
    outs = run_wrapped_rounds(gw, [_replies()] * 3)
    assert all(o is not None and o[0].shape == (D,) for o in outs)
    assert gw.gateway.principal_accountant(gw.principal).count == 3
    assert gw.epsilon_per_round == pytest.approx(epsilon_of(2.0, 1e-6))


def test_legacy_bridge_runs_the_message_api_gateway_under_a_legacy_workflow():
    """SecAgg+ in Flower 1.42 drives legacy strategies only: LegacyBridge hands the legacy fit round to
    the Message-API gateway (under SecAgg+ every result carries the aggregate; here plain replies)."""
    from flwr.app import ArrayRecord

    from fedmem.flower.bridge import LegacyBridge
    from fedmem.flower.harness import _identity, legacy_round

    _identity()
    gw = _gw()
    bridge = LegacyBridge(gw, ArrayRecord([np.zeros(D)]))
    out, ins = legacy_round(bridge, 1, _replies(), num_examples=5)
    assert len(ins) == M and out is not None and out[0].shape == (D,)
    assert all(fi.config["server-round"] == 1 for _, fi in ins)       # the Message-API config reaches FitIns
    assert gw.privacy_spent().num_releases == 1 and gw.audit[-1].decision == "admitted"
    out, _ = legacy_round(bridge, 2, _replies()[:-1] + [None], num_examples=5)   # a failure: fails closed
    assert out is None and gw.audit[-1].decision == "fault" and gw.privacy_spent().num_releases == 1
