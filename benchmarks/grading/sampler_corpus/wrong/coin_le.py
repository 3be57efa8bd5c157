"""`<=` instead of `<` on the coin. Undetectable: the law differs only when the float64 coin equals the ratio
exactly, probability at most 2**-53 per draw."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() <= min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))


def law(p, q):
    """The exact law this sampler emits, up to the coin landing on the ratio (probability <= 2**-53, left out): x ~ q,
    kept with min(1, p/q), else a draw from max(p - q, 0)."""
    accepted = q * np.minimum(1.0, np.divide(p, q, out=np.zeros_like(p), where=q > 0))
    residual = np.maximum(p - q, 0.0)
    return accepted + (1.0 - accepted.sum()) * residual / residual.sum()
