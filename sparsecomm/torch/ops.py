"""Typed wrappers of the torch ops in csrc/ (``torch.ops.sparsecomm.*``).

The ops are registered when ``sparsecomm._C`` is imported; the wrappers add nothing but
argument normalisation, so ``torch.ops.sparsecomm.X`` may be called directly too.
"""
from typing import Optional

import torch

from .. import _C  # noqa: F401  (loads the extension, registering torch.ops.sparsecomm)
from .._settings import seed_as_int64

_ops = torch.ops.sparsecomm


def random_block_start(seed: int, tensor_id: int, step: int, numel: int) -> int:
    """Start of the cyclic random block of a tensor of ``numel`` elements at ``step``.

    A pure function of its arguments (Philox4x32-10), identical on every rank and device."""
    return _ops.random_block_start(seed_as_int64(seed), tensor_id, step, numel)


def block_pack(grad: torch.Tensor, residual: Optional[torch.Tensor], start: int, length: int) -> torch.Tensor:
    """Error-feedback pack of the cyclic block ``[start, start + length)`` of ``grad`` (flattened).

    Returns the block's values in ``grad``'s dtype. ``residual`` (float32, ``grad.numel()``
    elements) is updated in place to ``residual + grad`` minus what was sent; ``None`` means
    no error feedback."""
    return _ops.block_pack(grad, residual, start, length)


def block_unpack(values: torch.Tensor, numel: int, start: int, scale: float = 1.0) -> torch.Tensor:
    """Dense 1-D tensor of ``numel`` elements: ``scale * values`` in the block, zero elsewhere."""
    return _ops.block_unpack(values, numel, start, scale)
