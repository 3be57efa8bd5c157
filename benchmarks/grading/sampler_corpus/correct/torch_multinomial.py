"""torch: a torch.Generator seeded from rng per call, torch.multinomial for both draws, torch.rand for the coin."""
import torch


def accept_reject(p, q, rng):
    gen = torch.Generator().manual_seed(int(rng.integers(2 ** 62)))
    target_probs, draft_probs = torch.from_numpy(p), torch.from_numpy(q)
    x = int(torch.multinomial(draft_probs, 1, generator=gen))
    if float(torch.rand((), generator=gen, dtype=torch.float64)) * draft_probs[x] < target_probs[x]:
        return x
    recovered = (target_probs - draft_probs).clamp(min=0)
    return int(torch.multinomial(recovered / recovered.sum(), 1, generator=gen))
