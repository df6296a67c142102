"""Shared fixtures. Heavy services (Ray, CrypTen parties) start once per test session."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


@pytest.fixture(scope="session")
def ray_local():
    """A private local Ray (2 CPUs, no dashboard) started once per test session, shut down at the end."""
    import ray

    from fedmem._ray import ensure_ray

    started = False
    if not ray.is_initialized():
        started = ensure_ray(num_cpus=2)   # a private local instance, beside any other cluster
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def crypten_parties(ray_local):
    """Two warm CrypTen compute parties (TFP provider) shared by the whole session.

    A test that breaks them (fault injection) must use its own ``CryptenParties``; if a
    party fails anyway, the next ``run`` restarts them.
    """
    from fedmem.federation.mpc import CryptenParties

    parties = CryptenParties(2, timeout_s=60.0)
    yield parties
    parties.close()
