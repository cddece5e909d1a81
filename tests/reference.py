"""Independent reference implementations, in plain Python / torch / numpy.

Nothing here imports sparsecomm: these are what the compiled kernels and the compressors
are checked against.
"""

import math
import zlib

import numpy as np

_M32 = 0xFFFFFFFF


def sum_of_squares(x, lanes=256, rows=16):
    """The sum of the squares of x (float32 values) in float64, in sparsecomm's fixed order:
    tiles of rows * lanes elements; in a tile, lane j adds the squares of elements j, j + lanes,
    ... in turn, then the lanes are added pairwise (lane j += lane j + h, h = lanes / 2, ..., 1);
    the tiles' sums the same way (lane j takes tiles j, j + lanes, ...). Written with numpy
    arrays of lanes: every addition is one float64 addition, in that order."""

    def pairwise(a):  # a: [n, lanes] -> [n]
        a = a.copy()
        h = lanes // 2
        while h:
            a[:, :h] += a[:, h : 2 * h]
            h //= 2
        return a[:, 0]

    def in_lanes(values, per_row):  # [n, per_row * lanes] -> [n, lanes], rows added in turn
        acc = np.zeros((values.shape[0], lanes))
        for r in range(per_row):
            acc += values[:, r * lanes : (r + 1) * lanes]
        return acc

    squares = np.asarray(x, dtype=np.float64).reshape(-1) ** 2  # exact: a float's square fits a double
    tile = rows * lanes
    tiles = -(-squares.size // tile)
    padded = np.zeros(tiles * tile)  # (zeros add nothing: every lane starts at +0)
    padded[: squares.size] = squares
    tile_sums = pairwise(in_lanes(padded.reshape(tiles, tile), rows))
    per_row = -(-tiles // lanes)
    padded = np.zeros(max(per_row, 1) * lanes)
    padded[:tiles] = tile_sums
    return float(pairwise(in_lanes(padded.reshape(1, -1), max(per_row, 1)))[0])


def philox4x32_10(counter, key):
    """Philox4x32-10 (Salmon et al., SC'11) on 4 uint32 counter words and 2 key words."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & _M32, p1 & _M32, ((p0 >> 32) ^ c3 ^ k1) & _M32, p0 & _M32
        k0 = (k0 + 0x9E3779B9) & _M32
        k1 = (k1 + 0xBB67AE85) & _M32
    return c0, c1, c2, c3


def block_start(seed, tensor_id, step, numel):
    """sparsecomm's selection stream: key = seed, counter = (draw 0, tensor id, step lo, step hi)."""
    if numel == 0:
        return 0
    out = philox4x32_10((0, tensor_id, step & _M32, step >> 32), (seed & _M32, seed >> 32))
    return (out[0] | (out[1] << 32)) % numel


def tensor_id(name):
    return zlib.crc32(name.encode("utf-8"))


def rank_seed(seed, rank):
    """rTop-k's seed on `rank`: the seed plus rank times 2**64 over the golden ratio (rounded),
    modulo 2**64: an independent Philox key per rank, rank 0's the seed itself."""
    return (seed + rank * 0x9E3779B97F4A7C15) % 2**64


def count(ratio, numel):
    return 0 if numel == 0 else min(numel, max(1, math.floor(ratio * numel + 0.5)))


def sparse_is_larger(ratio, numel):
    """The dense fallback of a float32 tensor: k wire rows (a 2-byte offset and the value, 6
    bytes) and a marker row for each 65,535-element bucket, against its 4 * numel bytes."""
    return (count(ratio, numel) + -(-numel // 65535)) * 6 >= numel * 4


def block_indices(start, length, numel):
    return (start + np.arange(length)) % max(numel, 1)


def random_block_pack(grad, residual, start, length):
    """(values, new residual) of the random-block error-feedback pack, in float32 torch.

    values are rounded to grad's dtype; the rounding error stays in the residual."""
    import torch

    acc = grad.reshape(-1).float()
    if residual is not None:
        acc = residual + acc
    idx = torch.as_tensor(block_indices(start, length, grad.numel()), dtype=torch.long)
    values = acc[idx].to(grad.dtype)
    left = acc.clone()
    left[idx] = finite_or_zero(acc[idx] - values.float())
    return values, left


def random_block_unpack(values, numel, start, scale=1.0):
    import torch

    dense = torch.zeros(numel, dtype=values.dtype)
    idx = torch.as_tensor(block_indices(start, values.numel(), numel), dtype=torch.long)
    dense[idx] = (values.float() * scale).to(values.dtype)
    return dense


def accumulate(grad, residual=None, momentum=None, momentum_factor=0.0, nesterov=False):
    """(acc, u) of error feedback with optional DGC momentum correction, in float32 torch:
    u = m u + g, acc = r + u; with Nesterov (DGC's official code) u = m (u + g), acc = r + u + g."""
    g = grad.reshape(-1).float()
    u = g
    if momentum is not None:
        u = momentum_factor * (momentum + g) if nesterov else momentum_factor * momentum + g
    acc = u if residual is None else residual + u
    return (acc + g if nesterov else acc), u


def finite_or_zero(left):
    """The NaN/Inf policy of a sent element's residual: a non-finite error is dropped."""
    import torch

    return torch.where(left.isfinite(), left, torch.zeros_like(left))


def send(acc, u, selected, dtype, residual=None, momentum=None, masking=True):
    """What a pack sends from acc at the boolean mask `selected`, and the new state."""
    values = acc[selected].to(dtype)
    new_residual = new_momentum = None
    if residual is not None:
        new_residual = acc.clone()
        new_residual[selected] = finite_or_zero(acc[selected] - values.float())
    if momentum is not None:
        new_momentum = u.clone()
        if masking:
            new_momentum[selected] = 0.0
    return values, selected.nonzero().reshape(-1), new_residual, new_momentum


def above(acc, threshold):
    """|acc| >= threshold, NaN included."""
    return ~(acc.abs() < threshold)


def topk_mask(acc, k):
    """The k largest |acc|, ties broken by the lower index (NaN counts as +inf, like feedback.h's magnitude)."""
    import torch

    mag = torch.nan_to_num(acc.abs().double(), nan=float("inf"), posinf=float("inf"))
    order = np.lexsort((np.arange(acc.numel()), -mag.cpu().numpy().reshape(-1)))[:k]  # by -|acc|, then by index
    mask = torch.zeros(acc.numel(), dtype=torch.bool)
    mask[torch.from_numpy(order)] = True
    return mask


def random_k_indices(seed, tensor_id, step, numel, k):
    """The shared-seed random-k indices: a 4-round Feistel permutation of [0, 2^b), keys from
    Philox draw 0x80000000, murmur3 finalizer rounds, cycle-walked into [0, numel); sorted."""
    M = 0xFFFFFFFF
    keys = philox4x32_10((0x80000000, tensor_id, step & M, step >> 32), (seed & M, seed >> 32))
    bits = 2
    while bits < 62 and (1 << bits) < numel:
        bits += 2
    half = bits // 2
    mask = (1 << half) - 1

    def mix(h):
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & M
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & M
        return h ^ (h >> 16)

    def feistel(x):
        left, right = (x >> half) & mask, x & mask
        for r in range(4):
            left, right = right, left ^ (mix(right ^ keys[r]) & mask)
        return (left << half) | right

    out = []
    for j in range(k):
        x = feistel(j)
        while x >= numel:
            x = feistel(x)
        out.append(x)
    return sorted(out)


def quantize(acc, bits):
    """(codes bytes, scales float32, decoded float32) of 1-/2-bit quantization with per-class
    means, computed in float64 then rounded like the kernels."""
    import numpy as np

    a = acc.double().numpy()
    split = np.float32(np.abs(a).mean()) if a.size else np.float32(0)
    code = (a >= 0).astype(np.uint32)
    if bits == 2:
        code |= (np.abs(acc.numpy()) >= split).astype(np.uint32) << 1
    scales = np.zeros(2 if bits == 1 else 4, np.float32)
    for c in range(scales.size):
        if (code == c).any():
            scales[c] = np.float32(a[code == c].mean())
    packed = np.zeros((a.size * bits + 7) // 8, np.uint8)
    for j, c in enumerate(code):
        packed[(j * bits) >> 3] |= np.uint8(c << ((j * bits) & 7))
    return packed, scales, scales[code]


WIRE_BUCKET = 65535  # elements a bucket of the wire (sparsecomm/core/wire.py)


def quantized_segment(codes, scales, index, numel):
    """One rank's quantized segment of sparsecomm.core.wire built in numpy: the count (int64,
    little-endian), the scales' bytes, each 65,535-element bucket's count and each index's offset
    in its bucket (uint16), the codes, zeros to a multiple of 8."""
    counts = np.bincount(index // WIRE_BUCKET, minlength=-(-numel // WIRE_BUCKET))
    parts = [
        np.array([index.size], "<i8").view(np.uint8),
        scales.astype("<f4").view(np.uint8),
        counts.astype("<u2").view(np.uint8),
        (index % WIRE_BUCKET).astype("<u2").view(np.uint8),
        codes,
    ]
    data = np.concatenate(parts)
    return np.concatenate([data, np.zeros(-data.size % 8, np.uint8)])


def quantized_ranks(numel, counts, bits, seed):
    """Each rank's (codes, scales, decoded, index) from quantize() of random values at sorted
    distinct indices."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ranks = []
    for count in counts:
        acc = torch.randn(count, generator=gen)
        codes, scales, decoded = quantize(acc, bits)
        index = torch.randperm(numel, generator=gen)[:count].sort().values.int().numpy()
        ranks.append((codes, scales, decoded, index))
    return ranks


def sample_count(numel, ratio, sample_ratio=0.01, min_hits=256):
    return max(1, min(numel, max(math.ceil(sample_ratio * numel), math.ceil(min_hits / ratio))))


def sampled_threshold(acc, ratio, seed, tensor_id, step, sample_ratio=0.01):
    """The documented sample (runs of 16 at an odd stride, offset from draw 1 of the selection
    stream) and its ceil(ratio * count)-th largest magnitude (NaN as +inf)."""
    import torch

    numel = acc.numel()
    if numel == 0:
        return float("inf")
    wanted = sample_count(numel, ratio, sample_ratio)
    run = 16 if numel // wanted >= 32 else 1
    runs = -(-wanted // run)
    stride = numel // runs
    if stride > run and stride % 2 == 0:
        stride -= 1
    slack = stride - run
    offset = 0
    if slack > 0:
        out = philox4x32_10((1, tensor_id, step & _M32, step >> 32), (seed & _M32, seed >> 32))
        offset = (out[0] | (out[1] << 32)) % (slack + 1)
    count = runs * run
    rank = min(count, max(1, math.ceil(ratio * count)))
    positions = torch.tensor([offset + (j // run) * stride + j % run for j in range(count)])
    mags = torch.nan_to_num(acc.reshape(-1)[positions].abs(), nan=float("inf"), posinf=float("inf"))
    return mags.sort(descending=True).values[rank - 1].item()


def sampled_mask(acc, ratio, seed, tensor_id, step, band=(0.8, 1.3)):
    """pack_sampled's selection: |acc| >= the sampled threshold, or the exact top k when that
    count falls outside [band[0] k, band[1] k]."""
    import torch

    k = count(ratio, acc.numel())
    if k >= acc.numel():  # everything is sent
        return torch.ones(acc.numel(), dtype=torch.bool)
    mask = above(acc, sampled_threshold(acc, ratio, seed, tensor_id, step))
    if not band[0] * k <= mask.sum().item() <= band[1] * k:
        mask = topk_mask(acc, k)
    return mask
