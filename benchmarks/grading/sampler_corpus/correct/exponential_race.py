"""The exponential race of the course's kernels: argmin(E_i / w_i) with E_i ~ Exp(1) draws i with probability w_i /
sum(w); zero weights never win."""
import numpy as np


def race(weights, rng):
    "argmin of Exp(1) / weight: token i with probability weight_i / sum(weights)."
    with np.errstate(divide="ignore"):
        return int(np.argmin(rng.exponential(size=len(weights)) / weights))


def accept_reject(p, q, rng):
    x = race(q, rng)
    if rng.random() < p[x] / q[x]:
        return x
    return race(np.maximum(p - q, 0.0), rng)
