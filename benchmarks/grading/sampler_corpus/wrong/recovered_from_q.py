"""On a rejection draws again from the drafter's q (the draft's row reused where the target's residual belongs, as
FAULTS 'bonus_from_draft' does for the bonus)."""


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    return int(rng.choice(len(q), p=q))
