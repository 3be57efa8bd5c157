"""The ratio rounded to two decimals before the coin."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(1.0, round(float(p[x] / q[x]), 2)):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))


def law(p, q):
    "The exact law this sampler emits: x ~ q, kept with min(1, round(p/q, 2)), else a draw from max(p - q, 0)."
    accepted = q * np.minimum(1.0, np.round(np.divide(p, q, out=np.zeros_like(p), where=q > 0), 2))
    residual = np.maximum(p - q, 0.0)
    return accepted + (1.0 - accepted.sum()) * residual / residual.sum()
