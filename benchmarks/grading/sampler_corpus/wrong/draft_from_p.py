"""Draws the draft from p instead of q, then the usual test and residual."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(p), p=p))
    if q[x] == 0 or rng.random() < min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
