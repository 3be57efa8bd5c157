"""Always returns a residual draw (the accept test left out)."""
import numpy as np


def accept_reject(p, q, rng):
    rng.choice(len(q), p=q)                      # the draft, drawn and then ignored
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
