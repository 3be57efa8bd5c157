"""Gumbel-max: the draft is argmax(log q + G), the recovered token argmax(log residual + G), G i.i.d. Gumbel from
rng; the test in log space."""
import numpy as np


def accept_reject(p, q, rng):
    with np.errstate(divide="ignore"):
        x = int(np.argmax(np.log(q) + rng.gumbel(size=len(q))))
        if np.log(rng.random()) < np.log(p[x]) - np.log(q[x]):
            return x
        return int(np.argmax(np.log(np.maximum(p - q, 0.0)) + rng.gumbel(size=len(p))))
