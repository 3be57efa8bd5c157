"""Accepts the draft when p(x) >= 0.1 instead of flipping a coin (speclab.proof.threshold_on_p_sampler)."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if p[x] >= 0.1:
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
