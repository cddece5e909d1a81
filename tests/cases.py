"""What the op tests share: the floating dtypes the kernels take, seeded inputs, and equality
bit for bit."""

import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def feedback_state(numel, device, seed=0, with_momentum=False):
    """A residual and (with_momentum) a momentum buffer, float32, seeded."""
    g = torch.Generator().manual_seed(seed)
    residual = (torch.randn(numel, generator=g) * 0.5).to(device)
    momentum = (torch.randn(numel, generator=g) * 0.5).to(device) if with_momentum else None
    return residual, momentum


def gradient(numel, dtype, device, seed=1, shape=None):
    """A seeded normal gradient of `dtype` on `device`."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape or (numel,), generator=g).to(dtype).to(device)


def same_bits(got, want):
    """Equal bit for bit (-0.0 apart from 0.0), every NaN matching a NaN."""
    nan, bits = want.isnan(), {4: torch.int32, 2: torch.int16}[want.element_size()]
    return torch.equal(got.isnan(), nan) and torch.equal(got[~nan].view(bits), want[~nan].view(bits))


def assert_same_params(got, want, what):
    """Every parameter of `want` (name -> tensor) equal in `got`, bit for bit; the message says
    by how much one differs."""
    for name in want:
        assert torch.equal(got[name], want[name]), (
            f"{what}: {name} differs by up to {float((got[name] - want[name]).abs().max()):.3g}"
        )


def gathered_selections(numel, per_rank, ranks, dtype, seed):
    """What an allgather brings to unpack: one index-ordered selection per rank, overlapping."""
    gen = torch.Generator().manual_seed(seed)
    index = torch.cat([_distinct(numel, per_rank, gen) for _ in range(ranks)]).int()
    return torch.randn(ranks * per_rank, generator=gen).to(dtype), index


def _distinct(numel, count, gen):
    """`count` distinct indices below `numel`, sorted. A permutation of all of them costs a
    second at the streamed unpacks' 16M elements: there, draw twice as many and keep `count`."""
    drawn = torch.randint(numel, (2 * count,), generator=gen).unique() if numel >= 4 * count else None
    if drawn is None or drawn.numel() < count:
        return torch.randperm(numel, generator=gen)[:count].sort().values
    return drawn[torch.randperm(drawn.numel(), generator=gen)[:count]].sort().values
