"""The residual p - q without the clamp at 0, handed to rng.choice: it raises on negative probabilities."""


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    residual = p - q
    return int(rng.choice(len(p), p=residual / residual[residual > 0].sum()))
