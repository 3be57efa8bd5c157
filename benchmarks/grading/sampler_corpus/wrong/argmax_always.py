"""Commits the target's argmax whatever the temperature (FAULTS 'argmax_always')."""
import numpy as np


def accept_reject(p, q, rng):
    return int(np.argmax(p))
