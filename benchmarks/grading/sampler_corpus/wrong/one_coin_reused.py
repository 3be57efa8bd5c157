"""One coin for the accept test and the residual draw: after a rejection u >= p(x)/q(x), so the residual's inverse
CDF reads a coin that is not uniform."""
import numpy as np


def draw(probs, u):
    "Inverse CDF: the first token whose cumulative mass exceeds u."
    return int(np.searchsorted(np.cumsum(probs), u, side="right"))


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    u = rng.random()
    if u < min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    return min(draw(residual / residual.sum(), u), len(p) - 1)
