"""The residual over tokens 1..V-1 (slicing off token 0) and its index not shifted back."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p[1:] - q[1:], 0.0)
    if residual.sum() == 0:
        return x
    return int(rng.choice(len(residual), p=residual / residual.sum()))
