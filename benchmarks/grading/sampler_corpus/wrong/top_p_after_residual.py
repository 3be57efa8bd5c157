"""The residual cut to its own top-p 0.9 nucleus after normalising (FAULTS 'top_p_after_residual')."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    residual = residual / residual.sum()
    order = np.argsort(-residual, kind="stable")
    keep = order[: int(np.searchsorted(np.cumsum(residual[order]), 0.9)) + 1]
    nucleus = np.zeros_like(residual)
    nucleus[keep] = residual[keep]
    return int(rng.choice(len(p), p=nucleus / nucleus.sum()))


def law(p, q):
    "The exact law this sampler emits: x ~ q, kept with min(1, p/q), else a draw from the residual's top-0.9 nucleus."
    accepted = q * np.minimum(1.0, np.divide(p, q, out=np.zeros_like(p), where=q > 0))
    residual = np.maximum(p - q, 0.0)
    residual = residual / residual.sum()
    order = np.argsort(-residual, kind="stable")
    keep = order[: int(np.searchsorted(np.cumsum(residual[order]), 0.9)) + 1]
    nucleus = np.zeros_like(residual)
    nucleus[keep] = residual[keep]
    return accepted + (1.0 - accepted.sum()) * nucleus / nucleus.sum()
