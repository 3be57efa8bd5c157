"""Returns the draft unverified: the drafter's token committed as is (law q)."""
import numpy as np


def accept_reject(p, q, rng):
    return int(rng.choice(len(q), p=q))
