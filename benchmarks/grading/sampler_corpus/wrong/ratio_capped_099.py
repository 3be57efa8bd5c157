"""The acceptance capped at 0.99 instead of 1 (min(0.99, p/q)): a draft the target likes more is still rejected 1%
of the time."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(0.99, p[x] / q[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))


def law(p, q):
    "The exact law this sampler emits: x ~ q, kept with min(0.99, p/q), else a draw from max(p - q, 0)."
    accepted = q * np.minimum(0.99, np.divide(p, q, out=np.zeros_like(p), where=q > 0))
    residual = np.maximum(p - q, 0.0)
    return accepted + (1.0 - accepted.sum()) * residual / residual.sum()
