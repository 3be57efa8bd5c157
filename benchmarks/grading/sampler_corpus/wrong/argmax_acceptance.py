"""The greedy rule at T > 0: accepts the draft only when it is the target's argmax, else a residual draw (FAULTS
'argmax_always')."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if x == int(np.argmax(p)):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
