"""The residual p - q without the clamp at 0, normalised and drawn by inverse CDF: negative entries shift the CDF
and no error is raised."""
import numpy as np


def draw(probs, u):
    "Inverse CDF: the first token whose cumulative mass exceeds u."
    return int(np.searchsorted(np.cumsum(probs), u, side="right"))


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    residual = p - q
    return min(draw(residual / residual[residual > 0].sum(), rng.random()), len(p) - 1)
