"""The coin that drew the draft by inverse CDF is reused for the accept test."""
import numpy as np


def draw(probs, u):
    "Inverse CDF: the first token whose cumulative mass exceeds u."
    return int(np.searchsorted(np.cumsum(probs), u, side="right"))


def accept_reject(p, q, rng):
    u = rng.random()
    x = min(draw(q, u), len(q) - 1)
    if u < min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
