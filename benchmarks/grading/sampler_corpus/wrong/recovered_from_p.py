"""On a rejection draws the recovered token from p, not from norm(max(p - q, 0)) (speclab.testing.FAULTS
'recovered_from_p', speclab.proof.resample_from_p_sampler)."""


def accept_reject(p, q, rng):
    x = int(rng.choice(len(q), p=q))
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    return int(rng.choice(len(p), p=p))
