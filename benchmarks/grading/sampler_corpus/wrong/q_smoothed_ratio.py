"""The ratio read from a label-smoothed q, (q + 0.01) / (1 + 0.01 V), while the draft is drawn from q itself."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    smooth = (q + 0.01) / (1 + 0.01 * len(q))
    if rng.random() < min(1.0, p[x] / smooth[x]):
        return x
    residual = np.maximum(p - q, 0.0)
    return int(rng.choice(len(p), p=residual / residual.sum()))


def law(p, q):
    "The exact law this sampler emits: x ~ q, kept with min(1, p/smoothed q), else a draw from max(p - q, 0)."
    accepted = q * np.minimum(1.0, p / ((q + 0.01) / (1 + 0.01 * len(q))))
    residual = np.maximum(p - q, 0.0)
    return accepted + (1.0 - accepted.sum()) * residual / residual.sum()
