"""An epsilon against division by zero in the ratio, p(x) / (q(x) + 0.01): small where q(x) is large, large where
it is small."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(1.0, p[x] / (q[x] + 0.01)):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))


def law(p, q):
    "The exact law this sampler emits: x ~ q, kept with min(1, p/(q + 0.01)), else a draw from max(p - q, 0)."
    accepted = q * np.minimum(1.0, p / (q + 0.01))
    residual = np.maximum(p - q, 0.0)
    return accepted + (1.0 - accepted.sum()) * residual / residual.sum()
