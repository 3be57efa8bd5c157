"""Accepts the draft when it is among the target's top-2 tokens (speclab.proof.topk_membership_sampler)."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if x in np.argsort(-p, kind="stable")[:2]:
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))
