"""torch.ops.sparsecomm block_pack / block_unpack against the plain-torch reference,
written once over device x dtype."""

import pytest
import torch
from cases import DTYPES
from reference import random_block_pack, random_block_unpack

from sparsecomm.torch import ops

# (numel, start, length): inside, touching the end, wrapping, whole tensor, empty block, odd sizes
CASES = [
    (1000, 10, 100),
    (1000, 900, 100),
    (1000, 950, 100),
    (1000, 0, 1000),
    (1000, 999, 1000),
    (1000, 17, 0),
    (1, 0, 1),
    (1, 0, 0),
    (0, 0, 0),
    (1001, 1000, 2),
    (4099, 4000, 333),
]


def _inputs(numel, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    grad = torch.randn(numel, generator=g).to(dtype)
    residual = torch.randn(numel, generator=g) * 0.1
    return grad.to(device), residual.to(device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel,start,length", CASES)
def test_pack_matches_reference_and_conserves(device, dtype, numel, start, length):
    grad, residual = _inputs(numel, dtype, device)
    residual_in = residual.clone()
    want_values, want_residual = random_block_pack(grad.cpu(), residual_in.cpu(), start, length)
    values = ops.block_pack(grad, residual, start, length)
    assert values.dtype == dtype and values.shape == (length,) and values.device == grad.device
    assert torch.equal(values.cpu(), want_values)
    assert torch.equal(residual.cpu(), want_residual)
    # Nothing lost: what was sent plus what is kept is exactly residual_in + grad (float32).
    sent = random_block_unpack(values.cpu().float(), numel, start)
    assert torch.equal(sent + residual.cpu(), residual_in.cpu() + grad.cpu().float())


@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_without_error_feedback_is_a_gather(device, dtype):
    grad, _ = _inputs(777, dtype, device)
    values = ops.block_pack(grad, None, 700, 100)
    want, _ = random_block_pack(grad.cpu(), None, 700, 100)
    assert torch.equal(values.cpu(), want)
    assert torch.equal(values.cpu(), torch.cat([grad.cpu()[700:], grad.cpu()[:23]]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel,start,length", CASES)
@pytest.mark.parametrize("scale", [1.0, 0.5, 1 / 3])
def test_unpack_matches_reference(device, dtype, numel, start, length, scale):
    values = torch.randn(length).to(dtype).to(device)
    dense = ops.block_unpack(values, numel, start, scale)
    assert dense.dtype == dtype and dense.shape == (numel,)
    assert torch.equal(dense.cpu(), random_block_unpack(values.cpu(), numel, start, scale))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel,start,length", CASES)
def test_unpack_into_out_writes_every_element(device, dtype, numel, start, length):
    values = torch.randn(length).to(dtype).to(device)
    out = torch.full((numel,), 7.0, dtype=dtype, device=device)  # stale contents: zeros must be written too
    assert ops.block_unpack(values, numel, start, 0.5, out=out) is out
    assert torch.equal(out.cpu(), random_block_unpack(values.cpu(), numel, start, 0.5))


def test_pack_accepts_non_contiguous_grad(device):
    base = torch.randn(64, 48, device=device)
    grad = base.t()  # non-contiguous view; the op reads it in its logical (row-major) order
    assert not grad.is_contiguous()
    residual = torch.zeros(grad.numel(), device=device)
    values = ops.block_pack(grad, residual, 3000, 200)
    want, want_residual = random_block_pack(grad.contiguous().cpu(), torch.zeros(grad.numel()), 3000, 200)
    assert torch.equal(values.cpu(), want) and torch.equal(residual.cpu(), want_residual)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rounding_to_16_bit_matches_torch_everywhere(device, dtype):
    """Every 16-bit pattern goes through float and back unchanged, but a NaN, which comes back as
    the dtype's quiet NaN with its sign (torch's bfloat16 cast writes 0xFFFF instead); float32
    sums round to 16 bits exactly as torch rounds them (ties to even, subnormals, overflow, inf)."""
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    finite = every[torch.isfinite(every.float())]
    values = ops.block_pack(finite.to(device), None, 0, finite.numel())
    assert torch.equal(values.cpu().view(torch.int16), finite.view(torch.int16))
    nan_in = every[torch.isnan(every.float())]
    quiet = 0x7FC0 if dtype == torch.bfloat16 else 0x7E00
    signs = nan_in.view(torch.int16).to(torch.int32) & 0x8000
    nan_out = ops.block_pack(nan_in.to(device), None, 0, nan_in.numel()).cpu().view(torch.int16)
    assert torch.equal(nan_out, (signs | quiet).to(torch.int16)), nan_out.unique()

    g = torch.Generator().manual_seed(1)
    scales = torch.tensor([1e-9, 6e-8, 1e-5, 1.0, 3e4, 7e4, 1e39], dtype=torch.float64)
    residual = (torch.randn(7, 4096, generator=g, dtype=torch.float64) * scales[:, None]).float().reshape(-1)
    residual[:4] = torch.tensor([float("inf"), -float("inf"), 65519.0, 65520.0])
    grad = torch.zeros(residual.numel(), dtype=dtype)
    res = residual.clone().to(device)
    values = ops.block_pack(grad.to(device), res, 0, residual.numel())
    assert torch.equal(values.cpu().float(), residual.to(dtype).float())


@pytest.mark.usefixtures("host_binding")
def test_ops_pass_opcheck():
    grad = torch.randn(50)
    torch.library.opcheck(ops._ops.block_pack.default, (grad, torch.zeros(50), 45, 10))
    torch.library.opcheck(ops._ops.block_pack.default, (grad, None, 3, 10))
    torch.library.opcheck(ops._ops.block_unpack.default, (torch.randn(10), 50, 45, 0.5))


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: ops.block_pack(torch.randn(10), None, 0, 11), r"length should be in \[0, numel=10\], got 11"),
        (lambda: ops.block_pack(torch.randn(10), None, 10, 1), r"start should be in \[0, numel=10\), got 10"),
        (lambda: ops.block_pack(torch.randn(10), None, -1, 1), r"start should be in \[0, numel=10\), got -1"),
        (
            lambda: ops.block_pack(torch.arange(10), None, 0, 1),
            r"expected a float32, float16 or bfloat16 tensor, got Long",
        ),
        (
            lambda: ops.block_pack(torch.randn(10), torch.zeros(10, dtype=torch.float64), 0, 1),
            r"residual should be float32, got Double",
        ),
        (
            lambda: ops.block_pack(torch.randn(10), torch.zeros(9), 0, 1),
            r"residual should have numel 10 like grad, got 9",
        ),
        (lambda: ops.block_unpack(torch.randn(2, 2), 10, 0), r"values should be 1-D, got 2-D"),
        (lambda: ops.block_unpack(torch.randn(11), 10, 0), r"length should be in \[0, numel=10\], got 11"),
        (
            lambda: ops.block_unpack(torch.randn(4), 10, 0, out=torch.empty(10, dtype=torch.float64)),
            r"out should be Float like values, got Double",
        ),
        (lambda: ops.block_unpack(torch.randn(4), 10, 0, out=torch.empty(20)[::2]), r"out should be contiguous"),
        (lambda: ops.random_block_start(0, 2**32, 0, 10), r"tensor_id should be a uint32, got 4294967296"),
        (lambda: ops.random_block_start(0, 0, -1, 10), r"step should be >= 0, got -1"),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()
