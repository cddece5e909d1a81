"""Single-process references of what one rank's compressor sends, in plain torch (tests/reference.py):
each method takes (grad, residual, ratio, name, step, seed) and returns (the dense float32
tensor of what was sent, the new residual); seed_for gives a rank's seed. Shared by the torch
and TF multi-rank tests."""

import reference
import torch


def random_block(grad, residual, ratio, name, step, seed):
    n = grad.numel()
    start = reference.block_start(seed, reference.tensor_id(name), step, n)
    values, residual = reference.random_block_pack(grad, residual, start, reference.count(ratio, n))
    return reference.random_block_unpack(values, n, start), residual


def topk(grad, residual, ratio, name, step, seed):
    acc, u = reference.accumulate(grad, residual)
    mask = reference.topk_mask(acc, reference.count(ratio, grad.numel()))
    values, index, residual, _ = reference.send(acc, u, mask, grad.dtype, residual)
    return torch.zeros(grad.numel()).index_put_((index,), values.float()), residual


def randomk(grad, residual, ratio, name, step, seed):
    acc, u = reference.accumulate(grad, residual)
    mask = torch.zeros(grad.numel(), dtype=torch.bool)
    mask[
        reference.random_k_indices(
            seed, reference.tensor_id(name), step, grad.numel(), reference.count(ratio, grad.numel())
        )
    ] = True
    values, index, residual, _ = reference.send(acc, u, mask, grad.dtype, residual)
    return torch.zeros(grad.numel()).index_put_((index,), values.float()), residual


def rtopk(grad, residual, ratio, name, step, seed, r_ratio):
    acc, u = reference.accumulate(grad, residual)
    n, tid = grad.numel(), reference.tensor_id(name)
    r, k = reference.count(r_ratio, n), reference.count(ratio, n)
    top_r = reference.topk_mask(acc, r).nonzero().reshape(-1)  # index order
    mask = torch.zeros(n, dtype=torch.bool)
    mask[top_r[reference.random_k_indices(seed, tid, step, r, k)]] = True
    values, index, residual, _ = reference.send(acc, u, mask, grad.dtype, residual)
    return torch.zeros(n).index_put_((index,), values.float()), residual


def threshold(grad, residual, ratio, name, step, seed, value_dtype=None):
    acc, u = reference.accumulate(grad, residual)
    mask = reference.sampled_mask(acc, ratio, 0, reference.tensor_id(name), step)
    values, index, residual, _ = reference.send(acc, u, mask, value_dtype or grad.dtype, residual)
    return torch.zeros(grad.numel()).index_put_((index,), values.float()), residual


def threshold_quantized(grad, residual, ratio, name, step, seed, bits):
    acc, u = reference.accumulate(grad, residual)
    mask = reference.sampled_mask(acc, ratio, 0, reference.tensor_id(name), step)
    _, _, decoded = reference.quantize(acc[mask], bits)
    residual = acc.clone()
    residual[mask] = acc[mask] - torch.from_numpy(decoded)
    return torch.zeros(grad.numel()).index_put_((mask.nonzero().reshape(-1),), torch.from_numpy(decoded)), residual


METHODS = {
    "threshold_1bit": lambda *a: threshold_quantized(*a, bits=1),
    "threshold_2bit": lambda *a: threshold_quantized(*a, bits=2),
    "threshold": threshold,
    "threshold_fp16": lambda *a: threshold(*a, value_dtype=torch.float16),
    "random_block": random_block,
    "topk": topk,
    "randomk": randomk,
    "rtopk_0.3": lambda *a: rtopk(*a, r_ratio=0.3),
    "rtopk_1.0": lambda *a: rtopk(*a, r_ratio=1.0),
}


def seed_for(method, seed, rank):
    """The seed `method` draws with on `rank`: rTop-k's draw is each rank's own
    (reference.rank_seed); RandomK's and RandomBlock's are shared by every rank."""
    return reference.rank_seed(seed, rank) if method.startswith("rtopk") else seed


def dgc_density(ratio, step, warmup_steps, stages):
    if step >= warmup_steps:
        return ratio
    return ratio ** ((step * stages // warmup_steps + 1) / (stages + 1))


def dgc(grad, state, density, name, step, momentum=0.9, masking=True, clip_limit=None, dense=False, nesterov=False):
    """One rank's DGC step on a flat gradient: clip to clip_limit (the threshold / sqrt(N)),
    u = m u + g, v += u (Nesterov: u = m (u + g), v += u + g), send the sampled-threshold
    selection of v, zero v (and u when masking) where sent. A tensor the policy sends dense gets
    momentum SGD: u = m u + g sent whole (Nesterov: u + g). state is (v, u); returns (the dense
    float32 tensor sent, the new state)."""
    v, u = state
    g = grad.reshape(-1)
    if clip_limit is not None:
        norm = g.float().norm().item()
        if norm > clip_limit:
            g = g * (clip_limit / norm)
    if dense:
        sent, u = reference.accumulate(g, None, u, momentum, nesterov)
        return sent.to(grad.dtype).float(), (v, u)
    acc, u = reference.accumulate(g, v, u, momentum, nesterov)
    mask = reference.sampled_mask(acc, density, 0, reference.tensor_id(name), step)
    values, index, v, u = reference.send(acc, u, mask, g.dtype, v, u, masking)
    return torch.zeros(g.numel()).index_put_((index,), values.float()), (v, u)


def _keep_largest(values, index, k, residual):
    """The k of largest |value| (ties: lower index, NaN as +inf), in index order; the others
    are added to `residual` (when given)."""
    if len(index) <= k:
        return values, index
    magnitude = torch.nan_to_num(values.abs().double(), nan=float("inf"), posinf=float("inf")).tolist()
    keep = sorted(sorted(range(len(index)), key=lambda j: (-magnitude[j], int(index[j])))[:k])
    mask = torch.zeros(len(index), dtype=torch.bool)
    mask[keep] = True
    if residual is not None:
        for j in (~mask).nonzero().reshape(-1).tolist():
            residual[index[j]] += values[j]
    return values[mask], index[mask]


def spardl(selections, residuals, k, numel, value_dtype=torch.float32):
    """SparDL on N ranks, plain torch: each rank's selection (float32 values, sorted int64
    indices) is split into N contiguous blocks; for every other block a rank keeps its
    ceil(k/N) largest and sends them to the block's owner; the owner adds the N contributions
    in rank order (float32, one at a time), keeps its ceil(k/N) largest sums, rounds them to
    `value_dtype` (what it drops and what rounding takes off go to its residual, a non-finite
    error as 0), and the owned blocks are gathered. Dropped values go to the dropping rank's
    residual (modified in place; None: dropped for good). Each send is wire rows (send_bytes).
    Returns (the float32 dense sum, bytes each rank received)."""
    ranks = len(selections)
    block = -(-numel // ranks)
    owned, received = spardl_owned(selections, residuals, k, numel, value_dtype)
    total = torch.zeros(numel)
    for rank, (v, i) in enumerate(owned):
        total[i] = v
        for other in range(ranks):
            if other != rank:
                received[other] += send_bytes(len(i), rank * block, min(numel, (rank + 1) * block), value_dtype)
    return total, received


def send_bytes(count, low, high, value_dtype):
    """Bytes of a send of `count` pairs of the indices [low, high) on the wire: a row of a 2-byte
    offset and the value for each, and one more for each 65,535-element bucket the range meets."""
    buckets = (high - 1) // 65535 - low // 65535 + 1 if high > low else 0
    return (count + buckets) * (2 + torch.empty(0, dtype=value_dtype).element_size())


def spardl_owned(selections, residuals, k, numel, value_dtype):
    """SparDL's reduce-scatter (see spardl): (each rank's reduced (values, index) of the block it
    owns, bytes each rank received)."""
    ranks = len(selections)
    block, per_rank = -(-numel // ranks), max(1, -(-k // ranks))
    inbox = [[None] * ranks for _ in range(ranks)]  # inbox[owner][sender]
    received = [0] * ranks
    for rank, (values, index) in enumerate(selections):
        for owner in range(ranks):
            part = (index >= owner * block) & (index < (owner + 1) * block)
            v, i = values[part], index[part]
            if owner != rank:
                v, i = _keep_largest(v, i, per_rank, residuals[rank])
                received[owner] += send_bytes(len(i), owner * block, min(numel, (owner + 1) * block), value_dtype)
            inbox[owner][rank] = (v, i)
    owned = []
    for owner in range(ranks):
        sums = {}
        for v, i in inbox[owner]:
            for value, position in zip(v.tolist(), i.tolist()):
                sums[position] = (
                    torch.tensor(sums.get(position, 0.0), dtype=torch.float32)
                    + torch.tensor(value, dtype=torch.float32)
                ).item()
        positions = sorted(sums)
        kept, index = _keep_largest(
            torch.tensor([sums[p] for p in positions], dtype=torch.float32),
            torch.tensor(positions, dtype=torch.long),
            per_rank,
            residuals[owner],
        )
        rounded = kept.to(value_dtype).float()
        if residuals[owner] is not None:
            residuals[owner][index] += reference.finite_or_zero(kept - rounded)
        owned.append((rounded, index))
    return owned, received


def hierarchical(selections, residuals, k, numel, per_host, value_dtype=torch.float32):
    """The hierarchical exchange on hosts of `per_host` consecutive ranks, plain torch: SparDL's
    reduce-scatter inside each host (spardl_owned over its ranks: local rank b keeps ceil(k/R)
    of the host's sums in block b), then every host's rows of each block added in host order
    (float32). Residuals as in spardl. Returns the float32 dense sum."""
    hosts = len(selections) // per_host
    owned = [
        spardl_owned(
            selections[h * per_host : (h + 1) * per_host],
            residuals[h * per_host : (h + 1) * per_host],
            k,
            numel,
            value_dtype,
        )[0]
        for h in range(hosts)
    ]
    total = torch.zeros(numel)
    for block in range(per_host):
        for host in range(hosts):
            v, i = owned[host][block]
            total[i] += v
    return total
