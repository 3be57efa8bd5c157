"""Accepts exactly when p(x) >= q(x), without a coin: the ratio compared with 1."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if p[x] >= q[x]:
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
