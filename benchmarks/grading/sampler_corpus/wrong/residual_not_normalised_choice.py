"""max(p - q, 0) handed to rng.choice without dividing by its sum: it raises."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    return int(rng.choice(len(p), p=np.maximum(p - q, 0.0)))
