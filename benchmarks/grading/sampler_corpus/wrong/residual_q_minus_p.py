"""The residual built the wrong way round: max(q - p, 0)."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(q - p, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
