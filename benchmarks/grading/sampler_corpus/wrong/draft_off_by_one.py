"""The draft's inverse CDF index one too low (searchsorted minus 1, clipped at 0), while the ratio reads the
shifted token."""
import numpy as np


def draw(probs, u):
    "Inverse CDF: the first token whose cumulative mass exceeds u."
    return int(np.searchsorted(np.cumsum(probs), u, side="right"))


def accept_reject(p, q, rng):
    x = max(min(draw(q, rng.random()), len(q) - 1) - 1, 0)
    if q[x] > 0 and rng.random() < min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
