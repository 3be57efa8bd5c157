"""Draws from numpy's global generator (np.random) instead of rng: the law is exact, the draws are not reproducible
from the grader's seed. Not a law bug: no exactness test can or should catch it."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(np.random.choice(len(q), p=q))
    if np.random.random() < min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(np.random.choice(len(p), p=residual / residual.sum()))


def law(p, q):
    "The exact law this sampler emits: x ~ q, kept with min(1, p/q): the exact law, else a draw from max(p - q, 0)."
    accepted = q * np.minimum(1.0, np.divide(p, q, out=np.zeros_like(p), where=q > 0))
    residual = np.maximum(p - q, 0.0)
    return accepted + (1.0 - accepted.sum()) * residual / residual.sum()
