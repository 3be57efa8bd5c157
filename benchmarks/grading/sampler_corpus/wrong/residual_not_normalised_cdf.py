"""max(p - q, 0) drawn by inverse CDF without dividing by its sum; a coin past the residual's mass lands on the
last token."""
import numpy as np


def draw(probs, u):
    "Inverse CDF: the first token whose cumulative mass exceeds u."
    return int(np.searchsorted(np.cumsum(probs), u, side="right"))


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    return min(draw(np.maximum(p - q, 0.0), rng.random()), len(p) - 1)
