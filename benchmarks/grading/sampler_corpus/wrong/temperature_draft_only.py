"""The draft drawn at temperature 0.5 (q squared, normalised) but the ratio read from q at temperature 1 (FAULTS
'temperature_target_only')."""
import numpy as np


def accept_reject(p, q, rng):
    sharp = q ** 2 / (q ** 2).sum()
    x = int(rng.choice(len(q), p=sharp))
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
