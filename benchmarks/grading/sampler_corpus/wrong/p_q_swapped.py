"""p and q swapped everywhere: the draft drawn from p, accepted with min(1, q/p), the residual max(q - p, 0). It
emits q exactly."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(p), p=p))
    if rng.random() < min(1.0, q[x] / p[x]):
        return x
    residual = np.maximum(q - p, 0.0)
    return int(rng.choice(len(q), p=residual / residual.sum()))
