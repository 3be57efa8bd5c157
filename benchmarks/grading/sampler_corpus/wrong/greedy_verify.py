"""Greedy verification at T > 0: keeps the draft if it is the argmax of p, else emits the argmax."""
import numpy as np


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    return x if x == int(np.argmax(p)) else int(np.argmax(p))
