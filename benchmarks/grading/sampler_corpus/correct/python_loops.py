"""Plain Python, no numpy calls but rng.random(): a loop over cumulative sums for both draws."""


def pick(weights, u):
    "The token whose cumulative weight first exceeds u * total (the last with weight at the end)."
    total = sum(weights)
    acc = 0.0
    last = 0
    for i, w in enumerate(weights):
        if w > 0:
            last = i
            acc += w
            if u * total < acc:
                return i
    return last


def accept_reject(p, q, rng):
    p, q = [float(v) for v in p], [float(v) for v in q]
    x = pick(q, rng.random())
    if rng.random() < min(1.0, p[x] / q[x]):
        return x
    return pick([max(a - b, 0.0) for a, b in zip(p, q)], rng.random())
