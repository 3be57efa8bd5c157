"""Returns the draft unverified: the drafter's token committed as is (law q)."""


def accept_reject(p, q, rng):
    return int(rng.choice(len(q), p=q))
