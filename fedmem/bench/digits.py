"""Offline stand-in for the MNIST-VAE features of papers/001 Sec. 6.2.

The paper retrieves in two PCA coordinates of a frozen 10-d VAE trained on MNIST. No
download is possible here, so fedmem uses scikit-learn's bundled ``load_digits`` (1797
8x8 images): PCA with 2 components is fitted on the images that are neither in the bank
nor queries, and both coordinates are divided by one common factor so that the mean
per-coordinate variance on the fitting set is 1 (the VAE posterior means of the paper
are of that order; one common factor keeps the PCA geometry, i.e. no whitening). The
corruption ``q = x + 3u`` then has the same relative strength as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmem import _validate as V


@dataclass(frozen=True)
class DigitsFeatures:
    bank: np.ndarray          # (n_bank, 2) private memory bank
    queries: np.ndarray       # (n_queries, 2) clean query features x_i
    bank_labels: np.ndarray
    query_labels: np.ndarray
    scale: float              # common factor the PCA coordinates were divided by


def digits_features(n_bank: int = 1000, n_queries: int = 256, *, rng: np.random.Generator) -> DigitsFeatures:
    """Split the digits into bank / queries / PCA-fit set (disjoint) and embed in 2-d."""
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA

    n_bank = V.positive_int("n_bank", n_bank)
    n_queries = V.positive_int("n_queries", n_queries)
    V.rng_check("rng", rng)
    data = load_digits()
    X, y = data.data.astype(np.float64), data.target
    if n_bank + n_queries > len(X) - 100:
        raise ValueError(f"n_bank + n_queries must leave at least 100 of {len(X)} digits to fit the PCA. "
                         f"Found {n_bank + n_queries}.")
    perm = rng.permutation(len(X))
    bank_idx, query_idx, fit_idx = perm[:n_bank], perm[n_bank:n_bank + n_queries], perm[n_bank + n_queries:]
    pca = PCA(n_components=2).fit(X[fit_idx])
    fit = pca.transform(X[fit_idx])
    scale = float(np.sqrt(np.mean(fit.var(axis=0))))
    return DigitsFeatures(bank=pca.transform(X[bank_idx]) / scale, queries=pca.transform(X[query_idx]) / scale,
                          bank_labels=y[bank_idx], query_labels=y[query_idx], scale=scale)
