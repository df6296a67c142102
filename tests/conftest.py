"""Shared fixtures. Heavy services (Ray, CrypTen parties) start once per test session."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)
