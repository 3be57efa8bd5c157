"""Top-p 0.9 applied to the draft's q when drawing, the ratio read from the full q (FAULTS 'top_p_target_only', the
mismatch the other way round)."""
import numpy as np


def accept_reject(p, q, rng):
    order = np.argsort(-q, kind="stable")
    keep = order[: int(np.searchsorted(np.cumsum(q[order]), 0.9)) + 1]
    nucleus = np.zeros_like(q)
    nucleus[keep] = q[keep]
    x = int(rng.choice(len(q), p=nucleus / nucleus.sum()))
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
