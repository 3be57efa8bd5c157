"""The residual from misaligned slices, max(p[1:] - q[:-1], 0), mapped back with +1."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p[1:] - q[:-1], 0.0)
    if residual.sum() == 0:
        return x
    return 1 + int(rng.choice(len(residual), p=residual / residual.sum()))
