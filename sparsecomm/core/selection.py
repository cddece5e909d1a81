"""How many elements a selection takes, and the constants of the sampled selections (both
frameworks and every kernel composite read them from here)."""

import math
import zlib

_UINT64 = 2**64

# A sampled threshold for exact top-k aims at k * (1 + CANDIDATE_DEVIATIONS / sqrt(h)) +
# CANDIDATES_EXTRA candidates, h the sampled values expected above the exact k-th: the count
# above a sampled threshold deviates by about 1/sqrt(h) of itself, so the margin is that many
# deviations (at most CANDIDATES_PER_K). The exact selection then runs over a small set (1.12 k
# for 1% of 25.6M elements, 1.38 k where h is the minimum 256) and rarely falls short of k
# (then a second, read-only pass takes every element).
CANDIDATE_DEVIATIONS = 6
CANDIDATES_PER_K = 1.5
CANDIDATES_EXTRA = 32
# Gradient dropping and DGC accept a sampled threshold whose count lies in [BAND[0] k, BAND[1] k]
# (DGC's official bounds); outside it they correct to exactly k.
BAND = (0.8, 1.3)
# Enough sampled values above the threshold that its count has about 6% relative deviation.
MIN_SAMPLED_HITS = 256


def selected_count(ratio, numel):
    """k = max(1, floor(ratio * numel + 1/2)) for a non-empty tensor, never above numel."""
    if numel == 0:
        return 0
    return min(numel, max(1, int(ratio * numel + 0.5)))


def candidate_ratio(k, numel, sample_ratio=0.01):
    """The density a sampled threshold aims at when it only has to bound an exact top-k."""
    if numel == 0:
        return 1.0
    ratio = k / numel
    hits = ratio * sample_count(numel, ratio, sample_ratio) if k else 1.0
    margin = min(CANDIDATES_PER_K, 1.0 + CANDIDATE_DEVIATIONS / math.sqrt(hits))
    return min(1.0, (margin * k + CANDIDATES_EXTRA) / numel)


def sample_count(numel, ratio, sample_ratio=0.01, min_hits=MIN_SAMPLED_HITS):
    """How many positions to sample for a threshold at density `ratio`: `sample_ratio` of the
    tensor, and at least enough that about `min_hits` sampled values pass it (the passing count
    then has a relative standard deviation of about 1/sqrt(min_hits): 6% for 256)."""
    return max(1, min(numel, max(math.ceil(sample_ratio * numel), math.ceil(min_hits / ratio))))


def tensor_id(name):
    """Stable 32-bit id of a parameter name: the same on every rank and in both frameworks
    (CRC-32 of its UTF-8 bytes). It keys the parameter's random selection stream."""
    return zlib.crc32(name.encode("utf-8"))


def stream_of(state):
    """The selection stream of a tensor at its state's step, beside the seed (philox.h's key), as the
    packs' keywords."""
    return dict(tensor_id=state.tensor_id, step=state.step)


def streams_of(states):
    """The selection streams of several tensors at their states' steps, as the batched packs' keywords."""
    return dict(ids=[state.tensor_id for state in states], steps=[state.step for state in states])


RANK_STRIDE = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: consecutive ranks' seeds far apart


def rank_seed(seed, rank):
    """The seed of rank `rank`'s own random stream (rank 0 keeps `seed`): rTop-k draws its k of
    the top r independently on every worker, as Barnes et al. (2020) analyse it."""
    return (seed + rank * RANK_STRIDE) % _UINT64


def seed_as_int64(seed):
    """The uint64 seed as the int64 with the same bits (the ops' integer type)."""
    return seed - _UINT64 if seed >= 2**63 else seed
