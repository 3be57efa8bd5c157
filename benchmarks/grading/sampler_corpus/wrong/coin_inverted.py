"""Accepts when the coin is above the ratio (u > p/q), the comparison turned round."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() > min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
