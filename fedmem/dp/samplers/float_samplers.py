"""The ``fast`` float samplers (numpy / torch; NOT DP as released) and the sampling-mode names.

A textbook floating-point Laplace or Gaussian sampler leaks through the low-order bits of
its output (Mironov, CCS 2012); :func:`is_private` says which modes are DP as released
(see the :mod:`fedmem.dp.samplers` docstring).
"""

from __future__ import annotations

import numpy as np

from fedmem import _validate as V

SAMPLING_MODES = ("fast", "secure")


def is_private(sampling) -> bool:
    """Whether a release drawn with ``sampling`` is DP as released (its floats leak nothing).

    ``"secure"`` -> True; ``"fast"`` -> False (float samplers leak through their low-order
    bits: reports label such runs "not DP (float sampler)"). Anything else raises.
    """
    if sampling == "secure":
        return True
    if sampling == "fast":
        return False
    raise ValueError(f"sampling must be one of {SAMPLING_MODES}. Found {sampling!r}.")


def gaussian(sigma: float, shape, rng) -> np.ndarray:
    V.positive("sigma", sigma)
    if isinstance(rng, np.random.Generator):
        return rng.normal(0.0, sigma, size=shape)
    import torch  # only for a torch.Generator: importing torch costs ~2.5 s

    return torch.normal(0.0, float(sigma), size=tuple(np.atleast_1d(shape)) if shape != () else (),
                        generator=rng, dtype=torch.float64).numpy()


def laplace(scale: float, shape, rng) -> np.ndarray:
    V.positive("scale", scale)
    if isinstance(rng, np.random.Generator):
        return rng.laplace(0.0, scale, size=shape)
    import torch  # only for a torch.Generator: importing torch costs ~2.5 s

    size = tuple(np.atleast_1d(shape)) if shape != () else ()
    # |Lap| ~ Exp(1) = -log(1 - r) for r in [0, 1) (always finite), times a random sign.
    # (The one-uniform form -sign(u) log(1 - 2|u|) with u = r - 1/2 gives -inf at r = 0.)
    r = torch.rand((2, *size), generator=rng, dtype=torch.float64).numpy()
    return scale * np.where(r[1] < 0.5, -1.0, 1.0) * -np.log1p(-r[0])
