"""The ratio without min(1, .): a coin below 1 is below any ratio >= 1, so the law is the same."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < p[x] / q[x]:
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
