"""The emitted law written out and drawn once: accepted mass min(p, q) plus the rejection mass times the residual,
drawn with one rng.choice (what the accept/reject step computes, in one draw)."""
import numpy as np


def accept_reject(p, q, rng):
    accepted = np.minimum(p, q)
    residual = np.maximum(p - q, 0.0)
    rejected = 1.0 - accepted.sum()
    law = accepted + (rejected * residual / residual.sum() if residual.sum() > 0 else 0.0)
    return int(rng.choice(len(p), p=law / law.sum()))
