"""A floor of 0.001 on the residual against division by zero, max(p - q, 0.001): tokens the target has no excess on
get recovered mass."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p - q, 0.001)
    return int(rng.choice(len(p), p=residual / residual.sum()))


def law(p, q):
    "The exact law this sampler emits: x ~ q, kept with min(1, p/q), else a draw from max(p - q, 0.001)."
    accepted = q * np.minimum(1.0, np.divide(p, q, out=np.zeros_like(p), where=q > 0))
    residual = np.maximum(p - q, 0.001)
    return accepted + (1.0 - accepted.sum()) * residual / residual.sum()
