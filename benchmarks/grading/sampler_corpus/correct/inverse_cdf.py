"""Inverse CDF by np.searchsorted with float64 coins, the coin scaled by the residual's mass instead of normalising
it, the index kept on the last token with mass."""
import numpy as np


def draw(probs, u):
    "Inverse CDF of unnormalised probs at u in [0, 1); never a token without mass."
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return min(i, int(np.flatnonzero(probs)[-1]))


def accept_reject(p, q, rng):
    x = draw(q, rng.random())
    if rng.random() * q[x] < p[x]:
        return x
    return draw(np.maximum(p - q, 0.0), rng.random())
