"""Validation of compressor settings, shared by the torch and TensorFlow front ends.
Every message names the argument, what was expected and what came."""
import math
import numbers
import zlib

_UINT64 = 2**64


def check_ratio(owner, ratio, name="ratio"):
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not 0.0 < float(ratio) <= 1.0:
        raise ValueError(f"{owner}: {name} should be a number in (0, 1], got {ratio!r}")
    return float(ratio)


def check_flag(owner, name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: {name} should be True or False, got {value!r}")
    return value


def check_seed(owner, seed):
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < _UINT64:
        raise ValueError(f"{owner}: seed should be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


def seed_as_int64(seed):
    """The uint64 seed as the int64 with the same bits (the ops' integer type)."""
    return seed - _UINT64 if seed >= 2**63 else seed


def selected_count(ratio, numel):
    """k = max(1, floor(ratio * numel + 1/2)) for a non-empty tensor, never above numel."""
    if numel == 0:
        return 0
    return min(numel, max(1, int(ratio * numel + 0.5)))


def tensor_id(name):
    """Stable 32-bit id of a parameter name: the same on every rank and in both frameworks
    (CRC-32 of its UTF-8 bytes). It keys the parameter's random selection stream."""
    return zlib.crc32(name.encode("utf-8"))


def sample_count(numel, ratio, sample_ratio=0.01, min_hits=256):
    """How many positions to sample for a threshold at density `ratio`: `sample_ratio` of the
    tensor, and at least enough that about `min_hits` sampled values pass it (the passing count
    then has a relative standard deviation of about 1/sqrt(min_hits): 6% for 256)."""
    return max(1, min(numel, max(math.ceil(sample_ratio * numel), math.ceil(min_hits / ratio))))


def check_dgc(owner, momentum, momentum_masking, clip_norm, warmup_steps, warmup_stages):
    """DGC's own arguments (both front ends); returns momentum as a float."""
    if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real) or not 0.0 <= momentum < 1.0:
        raise ValueError(f"{owner}: momentum should be a number in [0, 1), got {momentum!r}")
    check_flag(owner, "momentum_masking", momentum_masking)
    if clip_norm is not None and (isinstance(clip_norm, bool) or not isinstance(clip_norm, numbers.Real)
                                  or not clip_norm > 0):
        raise ValueError(f"{owner}: clip_norm should be None or a positive number, got {clip_norm!r}")
    for name, value, low in (("warmup_steps", warmup_steps, 0), ("warmup_stages", warmup_stages, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{owner}: {name} should be an integer >= {low}, got {value!r}")
    return float(momentum)


def check_exchange(owner, exchange, network):
    """exchange= and network= of the per-rank-coordinate methods (both front ends)."""
    from ._cost import Network
    if exchange not in ("auto", "allgather", "spardl"):
        raise ValueError(f"{owner}: exchange should be one of 'auto', 'allgather', 'spardl', got {exchange!r}")
    if network is not None and not isinstance(network, Network):
        raise TypeError(f"{owner}: network should be None (measured) or a sparsecomm.Network, got "
                        f"{type(network).__name__}")
    return exchange, network


def check_r(owner, ratio, r):
    """rTop-k's r: a fraction in [ratio, 1], by default 4 * ratio (at most 1)."""
    value = min(1.0, 4 * ratio) if r is None else check_ratio(owner, r, "r")
    if value < ratio:
        raise ValueError(f"{owner}: r should be at least ratio={ratio}, got {r!r}")
    return value


def check_quantize(owner, quantize, exchange):
    """Threshold's quantize=, and that SparDL (which adds values on the way) carries no codes."""
    if quantize not in (None, "fp16", "bf16", "1bit", "2bit"):
        raise ValueError(f"{owner}: quantize should be one of None, 'fp16', 'bf16', '1bit', '2bit', got {quantize!r}")
    if quantize in ("1bit", "2bit") and exchange == "spardl":
        raise ValueError(f"{owner}: exchange='spardl' adds values on the way and cannot carry {quantize} codes; "
                         f"use exchange='allgather' (or 'auto') with quantize={quantize!r}")
    return quantize
