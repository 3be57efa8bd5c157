"""Accepts with probability p(x), forgetting to divide by q(x)."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < p[x]:
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
