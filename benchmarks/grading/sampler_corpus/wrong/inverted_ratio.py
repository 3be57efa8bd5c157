"""Accepts with min(1, q(x) / p(x)): p and q swapped in the ratio."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if p[x] > 0 and rng.random() < min(1.0, q[x] / p[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
