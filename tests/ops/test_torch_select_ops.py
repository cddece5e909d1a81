"""Selection with error feedback (sample_threshold, accumulate_candidates, select_top,
send_selected, sparse_unpack, the wire rows and the pack_* composites) against plain torch and
numpy references."""

import math

import numpy as np
import pytest
import reference
import torch
from cases import DTYPES, feedback_state, gathered_selections, gradient, same_bits

from sparsecomm.torch import ops


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", [0, 1, 7, 1000, 4097])
@pytest.mark.parametrize("mode", ["plain", "feedback", "momentum", "momentum-only"])
def test_pack_above_is_exactly_the_elements_at_or_above_the_threshold(device, dtype, numel, mode):
    grad = gradient(numel, dtype, device)
    # momentum-only: DGC's dense path; the CUDA binding then reads acc back from the momentum.
    residual, momentum = feedback_state(numel, device, with_momentum=mode.startswith("momentum"))
    if mode in ("plain", "momentum-only"):
        residual = None
    m = 0.9 if mode.startswith("momentum") else 0.0
    acc, u = reference.accumulate(
        grad.cpu(), None if residual is None else residual.cpu(), None if momentum is None else momentum.cpu(), m
    )
    threshold = 1.0
    want = reference.send(acc, u, reference.above(acc, threshold), dtype, residual, momentum)
    total_before = acc.clone()
    values, index = ops.pack_above(grad, residual, threshold, momentum=momentum, momentum_factor=m)
    assert values.dtype == dtype and index.dtype == torch.int32
    assert torch.equal(index.cpu().long(), want[1])
    assert torch.equal(values.cpu(), want[0])
    if residual is not None:
        assert torch.equal(residual.cpu(), want[2])
        sent = torch.zeros(numel).index_add_(0, index.cpu().long(), values.cpu().float())
        assert torch.equal(sent + residual.cpu(), total_before)  # nothing lost, exactly
    if momentum is not None:
        assert torch.equal(momentum.cpu(), want[3])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "numel,k", [(1000, 10), (1000, 1000), (1000, 0), (1, 1), (0, 0), (100_003, 100), (100_003, 5000)]
)
def test_pack_topk_is_the_exact_top_k(device, dtype, numel, k):
    grad = gradient(numel, dtype, device)
    residual, _ = feedback_state(numel, device)
    acc, u = reference.accumulate(grad.cpu(), residual.cpu())
    want = reference.send(acc, u, reference.topk_mask(acc, k), dtype, residual.cpu())
    values, index = ops.pack_topk(grad, residual, k, seed=3, tensor_id=5, step=2)
    assert torch.equal(index.cpu().long(), want[1])
    assert torch.equal(values.cpu(), want[0])
    assert torch.equal(residual.cpu(), want[2])


@pytest.mark.usefixtures("host_binding")
def test_pack_topk_ties_go_to_the_lower_index_and_survive_a_sampling_miss():
    grad = torch.tensor([1.0, 3.0, -3.0, 2.0, 3.0, 0.0, -3.0])
    values, index = ops.pack_topk(grad, None, 3)
    assert index.tolist() == [1, 2, 4] and values.tolist() == [3.0, -3.0, 3.0]
    # All equal: every candidate ties; the first k win.
    values, index = ops.pack_topk(torch.ones(10_000), None, 7)
    assert index.tolist() == list(range(7))
    # A few huge values the strided sample cannot see: the exact fallback still finds them.
    grad = torch.zeros(1_000_000)
    grad[[5, 500_001, 999_999]] = torch.tensor([7.0, -8.0, 9.0])
    values, index = ops.pack_topk(grad, None, 3)
    assert index.tolist() == [5, 500_001, 999_999]


@pytest.mark.usefixtures("host_binding")
def test_pack_topk_matches_torch_topk_on_a_large_tensor():
    x = torch.randn(1_000_003, generator=torch.Generator().manual_seed(4))
    _, index = ops.pack_topk(x, None, 1000)
    assert torch.equal(index.long(), x.abs().topk(1000).indices.sort().values)


def _inputs(kind, numel, gen):
    if kind == "normal":
        return torch.randn(numel, generator=gen)
    if kind == "heavy-tailed":  # Cauchy: no variance, rare enormous values
        return torch.tan(torch.pi * (torch.rand(numel, generator=gen) - 0.5))
    if kind == "many-ties":  # five distinct values only
        return torch.randint(-2, 3, (numel,), generator=gen).float()
    if kind == "mostly-zero":
        x = torch.zeros(numel)
        x[torch.randperm(numel, generator=gen)[: numel // 200]] = torch.randn(numel // 200, generator=gen)
        return x
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["normal", "heavy-tailed", "many-ties", "mostly-zero"])
@pytest.mark.parametrize("ratio", [0.001, 0.01])
def test_pack_sampled_counts_land_in_the_band(device, kind, ratio):
    gen = torch.Generator().manual_seed(7)
    for step in range(5):
        x = _inputs(kind, 1_000_000, gen).to(device)
        residual = torch.zeros_like(x)
        before = x.clone()
        k = int(ratio * x.numel() + 0.5)
        values, index = ops.pack_sampled(x, residual, ratio, seed=1, tensor_id=2, step=step)
        assert 0.8 * k <= index.numel() <= 1.3 * k, (kind, step, index.numel(), k)
        sent = torch.zeros(x.numel(), device=device).index_add_(0, index.long(), values.float())
        assert torch.equal(sent + residual, before)  # nothing lost
        # What was sent is never smaller than what was kept.
        assert values.abs().min() >= residual.abs().max()


@pytest.mark.usefixtures("host_binding")
@pytest.mark.parametrize("kind", ["normal", "heavy-tailed"])
@pytest.mark.parametrize("ratio", [0.001, 0.01])
def test_sampled_threshold_alone_lands_in_the_band_on_continuous_inputs(kind, ratio):
    gen = torch.Generator().manual_seed(8)
    x = _inputs(kind, 2_000_000, gen)
    k = ratio * x.numel()
    for step in range(5):
        t = ops.sample_threshold(x, None, ratio, seed=1, tensor_id=9, step=step)
        assert t.shape == () and t.dtype == torch.float32
        assert 0.8 * k <= (x.abs() >= t).sum().item() <= 1.3 * k


@pytest.mark.usefixtures("host_binding")
def test_sample_threshold_sees_the_accumulated_values_and_is_deterministic():
    x = torch.randn(100_000)
    residual = torch.randn(100_000) * 10
    t_grad = ops.sample_threshold(x, None, 0.01, seed=1, step=0)
    t_acc = ops.sample_threshold(x, residual, 0.01, seed=1, step=0)
    assert t_acc > 3 * t_grad  # the residual dominates |acc|
    assert torch.equal(t_acc, ops.sample_threshold(x, residual, 0.01, seed=1, step=0))
    assert torch.equal(ops.sample_threshold(torch.empty(0), None, 0.01), torch.tensor(float("inf")))
    # The whole tensor sampled: the threshold is the exact k-th largest magnitude.
    small = torch.randn(500)
    t = ops._ops.sample_threshold(small, None, None, 0.0, 0.02, 500, 0, 0, 0)
    assert t == small.abs().topk(10).values[-1]


@pytest.mark.usefixtures("host_binding")
def test_nan_is_sent_not_kept():
    grad = torch.tensor([0.1, float("nan"), 0.2, 5.0])
    residual = torch.zeros(4)
    values, index = ops.pack_above(grad, residual, 1.0)
    assert index.tolist() == [1, 3] and values[0].isnan() and values[1] == 5.0
    assert not residual.isnan().any()
    values, index = ops.pack_topk(torch.tensor([0.1, float("nan"), 0.2]), None, 1)
    assert index.tolist() == [1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["plain", "feedback", "momentum", "momentum-only"])
@pytest.mark.parametrize("threshold", [1.0, 0.0, float("inf")])
def test_accumulate_candidates_applies_the_rule_in_every_lane(device, dtype, mode, threshold):
    """|acc| >= t, NaN always, on edge values spread over three full 64-element blocks, the 8
    lanes of their vector steps, and a tail: the CPU's vectorized float32 pass, its generic
    loop (16-bit gradients, the tail) and CUDA's must all give the reference's candidates and
    state."""
    numel = 3 * 64 + 13
    special = {
        3: float("nan"),
        9: float("inf"),
        17: -float("inf"),
        30: -0.0,
        63: 1.0,
        64: -1.0,
        100: 1.0 - 2**-7,
        127: float("nan"),
        150: -(1.0 - 2**-7),
        191: 2.0,
        195: -1.0,
        204: float("nan"),
    }
    at = torch.tensor(list(special))
    grad = gradient(numel, torch.float32, "cpu") * 0.5
    grad[at] = torch.tensor(list(special.values()))
    grad = grad.to(dtype).to(device)
    residual, momentum = feedback_state(numel, device, with_momentum=mode.startswith("momentum"))
    residual[at.to(device)] = 0.0  # acc of a special element is the special value
    if momentum is not None:
        momentum[at.to(device)] = 0.0
    if mode in ("plain", "momentum-only"):
        residual = None
    m = 0.9 if mode.startswith("momentum") else 0.0
    acc, u = reference.accumulate(
        grad.cpu(), None if residual is None else residual.cpu(), None if momentum is None else momentum.cpu(), m
    )
    got_acc, got_index = ops.accumulate_candidates(grad, residual, threshold, momentum=momentum, momentum_factor=m)
    want_index = reference.above(acc, threshold).nonzero().reshape(-1)
    if threshold == 1.0:  # the case is made: the edges on both sides of the threshold
        assert {3, 63, 64, 127, 195, 204} <= set(want_index.tolist()) and not {30, 100, 150} & set(want_index.tolist())
    assert torch.equal(got_index.cpu().long(), want_index)
    assert same_bits(got_acc.cpu(), acc[want_index])
    if residual is not None:
        assert same_bits(residual.cpu(), acc)
    if momentum is not None:
        assert same_bits(momentum.cpu(), u)


@pytest.mark.parametrize("send", ["send_selected_float16", "block_pack_float16", "send_quantized_1bit"])
def test_a_non_finite_sent_value_of_a_finite_acc_leaves_zero(send):
    """The NaN/Inf policy: a sent non-finite value is never kept in the residual."""
    acc = torch.tensor([1e5, 1.0, float("inf"), -2.0])  # 1e5 is finite in float32, inf in float16
    index = torch.arange(4, dtype=torch.int32)
    residual = acc.clone()
    if send == "send_selected_float16":
        sent = ops.send_selected(acc, index, residual, torch.float16).float()
    elif send == "block_pack_float16":  # acc = 1e4 + 6e4, inf in float16
        residual = torch.tensor([1e4, 0.0, 0.0, 0.0])
        sent = ops.block_pack(torch.tensor([6e4, 1.0, 3.0, -2.0], dtype=torch.float16), residual, 0, 4).float()
    else:
        codes, scales = ops.send_quantized(acc, index, residual, 1)
        sent = ops.dequantize(codes, scales, 4, 1)
    assert not sent.isfinite().all()  # what makes the case: an infinite value was sent
    assert residual.isfinite().all(), residual


def test_non_contiguousgradient(device):
    grad = torch.randn(300, 200, device=device).t()
    residual = torch.zeros(grad.numel(), device=device)
    values, index = ops.pack_above(grad, residual, 2.0)
    flat = grad.contiguous().reshape(-1).cpu()
    assert torch.equal(index.cpu().long(), (flat.abs() >= 2.0).nonzero().reshape(-1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 0.5, 1 / 3])
def test_sparse_unpack_equals_index_add_with_duplicates(device, dtype, scale):
    gen = torch.Generator().manual_seed(2)
    # Three "ranks" sending overlapping index sets, concatenated.
    index = torch.cat([torch.randperm(500, generator=gen)[:100] for _ in range(3)]).int()
    values = torch.randn(300, generator=gen).to(dtype)
    dense = ops.sparse_unpack(values.to(device), index.to(device), 500, scale)
    want = (torch.zeros(500).index_add_(0, index.long(), values.float()) * scale).to(dtype)
    assert dense.dtype == dtype and torch.equal(dense.cpu(), want)
    assert torch.equal(
        ops.sparse_unpack(torch.empty(0, dtype=dtype), torch.empty(0, dtype=torch.int32), 4, 1.0),
        torch.zeros(4, dtype=dtype),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 1 / 3])
def test_sparse_unpack_merges_ascending_runs_into_out(device, dtype, scale):
    # 70,000 elements: several of the CPU merge's zeroing blocks; stale contents of out must go.
    values, index = gathered_selections(70_000, 2000, 3, dtype, seed=5)
    want = (torch.zeros(70_000).index_add_(0, index.long(), values.float()) * scale).to(dtype)
    out = torch.full((70_000,), 7.0, dtype=dtype, device=device)
    got = ops.sparse_unpack(values.to(device), index.to(device), 70_000, scale, out=out)
    assert got is out and torch.equal(out.cpu(), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", [0, 1, 1000, 70_001, 300_007])
@pytest.mark.parametrize("state", ["residual", "momentum", "both"])
def test_accumulate_keeps_acc_and_u_for_every_element(device, dtype, numel, state):
    """Random-k's pass before its gather: the residual takes acc and the momentum u for every
    element (reference.accumulate's rounding), nothing else is written; NaN (a candidate of
    accumulate_candidates at any threshold) and inf go through like any value."""
    grad = gradient(numel, dtype, "cpu", seed=5)
    grad[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])[:numel]
    residual, momentum = feedback_state(numel, "cpu", seed=6, with_momentum=state != "residual")
    residual = None if state == "momentum" else residual
    acc, u = reference.accumulate(grad, residual, momentum, 0.9)
    got_residual, got_momentum = [None if x is None else x.to(device) for x in (residual, momentum)]
    grad_before = grad.clone()
    got_grad = grad.to(device)
    assert ops.accumulate(got_grad, got_residual, momentum=got_momentum, momentum_factor=0.9) is None
    assert same_bits(got_grad.cpu(), grad_before)
    if got_residual is not None:
        assert same_bits(got_residual.cpu(), acc)
    if got_momentum is not None:
        assert same_bits(got_momentum.cpu(), u)


@pytest.mark.usefixtures("host_binding")
def test_accumulate_passes_opcheck_and_names_bad_arguments():
    torch.library.opcheck(ops._ops.accumulate.default, (torch.randn(30), torch.randn(30), torch.randn(30), 0.9))
    torch.library.opcheck(ops._ops.accumulate.default, (torch.randn(30), None, torch.randn(30), 0.9))
    with pytest.raises(RuntimeError, match=r"accumulate: residual should have numel 24 like grad, got 23"):
        ops.accumulate(torch.randn(24), torch.zeros(23))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", [0, 1, 1000, 70_001])
def test_momentum_step_writes_the_momentum_into_the_gradient(device, dtype, numel):
    """DGC's dense route: u = 0.9 * momentum + grad (reference.accumulate's rounding), kept as the
    momentum and written into the gradient rounded to its dtype; inf and NaN go through."""
    grad = gradient(numel, dtype, "cpu", seed=3)
    grad[:2] = torch.tensor([float("inf"), float("nan")])[:numel]
    _, momentum = feedback_state(numel, "cpu", seed=4, with_momentum=True)
    _, u = reference.accumulate(grad, None, momentum, 0.9)
    got_grad, got_momentum = grad.to(device), momentum.to(device)
    assert ops.momentum_step(got_grad, got_momentum, 0.9) is None
    assert same_bits(got_momentum.cpu(), u) and same_bits(got_grad.cpu(), u.to(dtype))


# Three 64-element blocks and a tail: the CPU's vectorized and generic loops and CUDA's.
NESTEROV_NUMELS = [0, 1, 3 * 64 + 13, 70_001]


def _nesterov_case(numel, dtype, device):
    """A gradient with NaN, infinities and -0, a residual and a momentum, and the reference's
    Nesterov (acc, u) of them."""
    grad = gradient(numel, dtype, "cpu", seed=11) * 3
    specials = torch.tensor([float("nan"), float("inf"), -0.0, -float("inf")], dtype=dtype)
    grad[: min(4, numel)] = specials[: min(4, numel)]
    residual, momentum = feedback_state(numel, "cpu", seed=12, with_momentum=True)
    acc, u = reference.accumulate(grad, residual, momentum, 0.9, nesterov=True)
    return grad.to(device), residual.to(device), momentum.to(device), acc, u


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", NESTEROV_NUMELS)
def test_nesterov_accumulate_candidates_follows_dgc_official_rule(device, dtype, numel):
    """u = 0.9 (u + g), acc = (r + u) + g, element by element with the reference's rounding: the
    state takes acc and u, the candidates are |acc| >= threshold in index order, NaN included."""
    grad, residual, momentum, acc, u = _nesterov_case(numel, dtype, device)
    got_acc, index = ops.accumulate_candidates(
        grad, residual, 1.0, momentum=momentum, momentum_factor=0.9, nesterov=True
    )
    assert same_bits(residual.cpu(), acc) and same_bits(momentum.cpu(), u)
    want = reference.above(acc, 1.0)
    assert torch.equal(index.cpu().long(), want.nonzero().reshape(-1))
    assert same_bits(got_acc.cpu(), acc[want])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", [1, 3 * 64 + 13, 70_001])
def test_nesterov_sample_threshold_samples_nesterov_acc(device, dtype, numel):
    """The sampled threshold of the Nesterov state is that of its acc taken as a plain float32
    gradient: the same positions, the same magnitudes; the state is not written."""
    grad, residual, momentum, acc, _ = _nesterov_case(numel, dtype, device)
    state_before = residual.clone(), momentum.clone()
    got = ops.sample_threshold(grad, residual, 0.05, momentum=momentum, momentum_factor=0.9, nesterov=True, step=3)
    want = ops.sample_threshold(acc.to(device), None, 0.05, step=3)
    assert same_bits(got.cpu().reshape(1), want.cpu().reshape(1))
    assert torch.equal(residual, state_before[0]) and torch.equal(momentum, state_before[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", NESTEROV_NUMELS)
def test_nesterov_momentum_step_sends_u_plus_g(device, dtype, numel):
    """DGC's dense route with Nesterov: u = 0.9 (u + g) is kept, u + g (rounded to the gradient's
    dtype) is what is reduced."""
    grad, _, momentum, _, _ = _nesterov_case(numel, dtype, device)
    sent, u = reference.accumulate(grad.cpu(), None, momentum.cpu(), 0.9, nesterov=True)
    assert ops.momentum_step(grad, momentum, 0.9, nesterov=True) is None
    assert same_bits(momentum.cpu(), u) and same_bits(grad.cpu(), sent.to(dtype))


@pytest.mark.usefixtures("host_binding")
def test_nesterov_needs_its_state():
    grad, state = torch.randn(30), torch.zeros(30)
    with pytest.raises(RuntimeError, match=r"sample_threshold: nesterov=True needs a momentum tensor, got None"):
        ops.sample_threshold(grad, state, 0.1, nesterov=True)
    with pytest.raises(RuntimeError, match=r"accumulate_candidates: nesterov=True needs a residual, got None"):
        ops.accumulate_candidates(grad, None, 1.0, momentum=state, momentum_factor=0.9, nesterov=True)
    with pytest.raises(RuntimeError, match=r"accumulate_candidates: nesterov=True needs a momentum tensor, got None"):
        ops.accumulate_candidates(grad, state, 1.0, nesterov=True)
    torch.library.opcheck(
        ops._ops.accumulate_candidates.default,
        (torch.randn(30), torch.randn(30), torch.randn(30), 0.9, torch.tensor(0.5), None, True),
    )


GRAD_SCALES = [0.3, 1.0, 2.5]


def _scaled_case(dtype, device, scale):
    """A gradient over three 64-element blocks and a tail (the CPU's vectorized float32 loop, its
    generic loop, CUDA's), NaN, infinities and -0 among its values, the same gradient scaled in
    place as DGC's clipping did before its factor rode the kernels (float32 multiply, one
    rounding), residual and momentum, and the scale as the ops take it."""
    numel = 3 * 64 + 13
    grad = gradient(numel, dtype, "cpu", seed=8) * 3
    grad[[3, 9, 30, 70, 200]] = torch.tensor([float("nan"), float("inf"), -0.0, -float("inf"), 0.0], dtype=dtype)
    factor = torch.tensor(scale, dtype=torch.float32)
    scaled = grad.clone().mul_(factor)
    residual, momentum = feedback_state(numel, "cpu", seed=9, with_momentum=True)
    return grad.to(device), scaled.to(device), residual.to(device), momentum.to(device), factor.to(device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", GRAD_SCALES)
def test_grad_scale_reads_the_gradient_as_if_it_were_scaled_first(device, dtype, scale):
    """DGC's clipping factor as a grad_scale: sample_threshold, accumulate_candidates and
    momentum_step give the bits the same op gives on the gradient scaled in place, and leave the
    gradient itself as it was (the scale is read where the op runs: nothing scales it first)."""
    grad, scaled, residual, momentum, factor = _scaled_case(dtype, device, scale)
    before = grad.clone()
    for sample_count in (8, grad.numel()):  # runs of a scattered sample; the tensor sampled whole
        want = ops._ops.sample_threshold(scaled, residual, momentum, 0.9, 0.1, sample_count, 3, 4, 5)
        got = ops._ops.sample_threshold(grad, residual, momentum, 0.9, 0.1, sample_count, 3, 4, 5, factor)
        assert same_bits(got.cpu().reshape(1), want.cpu().reshape(1))
    for state in ("residual", "momentum", "both"):
        r = None if state == "momentum" else residual.clone()
        m = None if state == "residual" else momentum.clone()
        want_r, want_m = [None if x is None else x.clone() for x in (r, m)]
        want = ops.accumulate_candidates(scaled, want_r, 1.0, momentum=want_m, momentum_factor=0.9)
        got = ops.accumulate_candidates(grad, r, 1.0, momentum=m, momentum_factor=0.9, grad_scale=factor)
        assert torch.equal(got[1].cpu(), want[1].cpu()) and same_bits(got[0].cpu(), want[0].cpu())
        for got_state, want_state in ((r, want_r), (m, want_m)):
            assert got_state is None or same_bits(got_state.cpu(), want_state.cpu())
    assert same_bits(grad.cpu(), before.cpu())
    want_m = momentum.clone()
    ops.momentum_step(scaled, want_m, 0.9)
    ops.momentum_step(grad, momentum, 0.9, grad_scale=factor)
    assert same_bits(momentum.cpu(), want_m.cpu()) and same_bits(grad.cpu(), scaled.cpu())


@pytest.mark.usefixtures("host_binding")
def test_grad_scale_passes_opcheck_and_names_bad_arguments():
    grad, s = torch.randn(300), torch.tensor(0.5)
    torch.library.opcheck(
        ops._ops.sample_threshold.default, (grad, torch.zeros(300), torch.zeros(300), 0.9, 0.01, 64, 1, 2, 3, s)
    )
    torch.library.opcheck(
        ops._ops.accumulate_candidates.default, (grad, None, torch.zeros(300), 0.9, torch.tensor(1.0), s)
    )
    torch.library.opcheck(ops._ops.momentum_step.default, (grad, torch.zeros(300), 0.9, s))
    acc, index = ops.accumulate_candidates(torch.empty(0), None, 1.0, momentum=torch.empty(0), grad_scale=s)
    assert acc.numel() == index.numel() == 0  # (an empty tensor's state has no data to point at)
    with pytest.raises(
        RuntimeError,
        match=r"accumulate_candidates: grad_scale needs a residual or a momentum, "
        r"got neither",
    ):
        ops.accumulate_candidates(grad, None, 1.0, grad_scale=s)
    with pytest.raises(
        RuntimeError,
        match=r"momentum_step: grad_scale should be a 1-element float32 tensor, "
        r"got 2 Float",
    ):
        ops.momentum_step(grad, torch.zeros(300), 0.9, grad_scale=torch.ones(2))
    with pytest.raises(
        RuntimeError,
        match=r"sample_threshold: grad_scale should be a 1-element float32 tensor, "
        r"got 1 Double",
    ):
        ops.sample_threshold(grad, None, 0.1, grad_scale=torch.tensor(0.5, dtype=torch.float64))


@pytest.mark.usefixtures("host_binding")
def test_momentum_step_passes_opcheck_and_names_bad_arguments():
    torch.library.opcheck(ops._ops.momentum_step.default, (torch.randn(30), torch.randn(30), 0.9))
    with pytest.raises(RuntimeError, match=r"momentum_step: grad should be contiguous \(it is written in place\)"):
        ops.momentum_step(torch.randn(4, 6).t(), torch.zeros(24), 0.9)
    with pytest.raises(RuntimeError, match=r"momentum_step: momentum should have numel 24 like grad, got 23"):
        ops.momentum_step(torch.randn(24), torch.zeros(23), 0.9)


SQUARE_SIZES = [0, 1, 255, 4096, 4097, 3 * 4096 + 5, 257 * 4096 + 3]  # tiles of 4,096; 256 lanes of tiles


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", SQUARE_SIZES)
def test_sum_of_squares_is_the_float64_sum_in_its_fixed_order(device, dtype, numel):
    """DGC's clipping norm, squared: exactly the reference's float64 sum in the documented order
    (tiles, lanes, pairwise), and within 1e-12 of the exactly rounded sum (math.fsum)."""
    x = gradient(numel, dtype, device, seed=numel) * 3
    got = ops.sum_of_squares(x)
    assert got.dtype == torch.float64 and got.shape == () and got.device == x.device
    values = x.cpu().float().numpy().astype(np.float64)
    assert got.item() == reference.sum_of_squares(values)
    assert math.isclose(got.item(), math.fsum(values**2), rel_tol=1e-12)


def test_sum_of_squares_bits_do_not_depend_on_threads_or_layout(device):
    """A fixed order: the same bits with 1 thread and with several (the CPU splits tensors of 1M
    elements and more over its cores), and for a strided view as for its contiguous copy."""
    x = gradient(0, torch.float32, device, seed=5, shape=(1200, 1001)) * 1e3
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.sum_of_squares(x).item()
        torch.set_num_threads(max(threads, 2))
        several = ops.sum_of_squares(x).item()
    finally:
        torch.set_num_threads(threads)
    assert one == several == reference.sum_of_squares(x.cpu().numpy().astype(np.float64))
    assert ops.sum_of_squares(x.t()).item() == ops.sum_of_squares(x.t().contiguous()).item()


@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_of_squares_of_non_finite_values_and_extremes(device, dtype):
    """NaN anywhere gives NaN; an infinity (and no NaN) +inf; -0 adds +0; float32's largest
    squares do not overflow in float64; a 16-bit gradient is read as its own values."""
    base = torch.zeros(5000, dtype=dtype)
    base[4999] = -0.0
    for at, value, want in ((17, float("nan"), "nan"), (4500, float("-inf"), "inf"), (3, -2.0, 4.0)):
        x = base.clone()
        x[at] = value
        got = ops.sum_of_squares(x.to(device)).item()
        assert math.isnan(got) if want == "nan" else got == float(want), (at, value, got)
    big = torch.finfo(dtype).max
    x = torch.full((10,), big, dtype=dtype).to(device)
    assert ops.sum_of_squares(x).item() == 10 * float(big) ** 2


@pytest.mark.usefixtures("host_binding")
def test_sum_of_squares_passes_opcheck_and_names_bad_arguments():
    for dtype in DTYPES:
        torch.library.opcheck(ops._ops.sum_of_squares.default, (torch.randn(4, 1100).to(dtype),))
    with pytest.raises(RuntimeError, match=r"sum_of_squares: expected a float32, float16 or bfloat16 tensor, got Int"):
        ops.sum_of_squares(torch.ones(3, dtype=torch.int32))


MERGED_RUNS = 1024  # csrc/cpu/select.cpp: kMaxMergedRuns, past which the CPU unpack sums in a dense scratch


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["40 runs", "no order"])
def test_sparse_unpack_of_many_runs_sums_each_index_in_input_order(device, dtype, order):
    """Many ranks' selections (the CPU merge walks each run in each block), or pairs in no
    useful order (more runs than MERGED_RUNS: the CPU sums in a dense scratch): every index's
    contributions summed in input order, from +0, with -0, NaN and +-inf among the values, over
    several blocks and a chunk boundary of the parallel pass (a lone -0 lands as +0)."""
    gen = torch.Generator().manual_seed(8)
    if order == "40 runs":  # each of 600 indices, 3,500 apart, in about 20 runs; then 600 lone ones
        numel = (1 << 21) + 3
        index = torch.cat(
            [torch.randperm(600, generator=gen)[:300].sort().values * 3500 for _ in range(40)]
            + [torch.arange(600) * 3500 + 1]
        ).int()
        values = torch.randn(index.numel(), generator=gen).to(dtype)
    else:  # ascending selections, flipped: every pair starts a run
        numel = 9_000
        values, index = (t.flip(0) for t in gathered_selections(numel, 800, 3, dtype, seed=9))
        assert index.numel() > MERGED_RUNS
    values[::97], values[1::89], values[2::83], values[3::79] = -0.0, float("nan"), float("inf"), -float("inf")
    want = (torch.zeros(numel).index_add_(0, index.long(), values.float()) * (1 / 3)).to(dtype)
    out = torch.full((numel,), 7.0, dtype=dtype, device=device)
    ops.sparse_unpack(values.to(device), index.to(device), numel, 1 / 3, out=out)
    got, number = out.cpu(), ~want.isnan()
    assert torch.equal(got.isnan(), ~number)
    assert torch.equal(got[number], want[number]) and torch.equal(got[number].signbit(), want[number].signbit())


STREAMED_BYTES = 32 << 20  # csrc/cpu/stream.h: kStreamMinBytes, from which the CPU unpacks stream their output


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [1, 3, 8])
@pytest.mark.parametrize("streamed", [False, True])
def test_unpacks_into_an_unaligned_out_write_exactly_its_elements(request, device, dtype, offset, streamed):
    """The CPU unpacks stream a large output (non-temporal stores, which need 16-byte
    alignment): an `out` that starts and ends off that alignment is written whole, and not one
    element past it on either side; a small output is written through the cache."""
    # The CUDA unpacks do not stream: small on the other devices, the emulated one included
    # (its tensors are on the CPU, so `device` alone does not tell it apart).
    large = streamed and request.node.callspec.params["device"] == "cpu"
    numel = STREAMED_BYTES // torch.empty(0, dtype=dtype).element_size() + 1 if large else 70_001
    values, index = gathered_selections(numel, 2000, 2, dtype, seed=7)
    buffer = torch.full((numel + 16,), 7.0, dtype=dtype, device=device)
    out = buffer[offset : offset + numel]
    want = torch.zeros(numel).index_add_(0, index.long(), values.float()).to(dtype)
    ops.sparse_unpack(values.to(device), index.to(device), numel, out=out)
    assert torch.equal(out.cpu(), want)
    ops.block_unpack(values[:500].to(device), numel, numel - 100, out=out)
    assert torch.equal(out.cpu(), reference.random_block_unpack(values[:500], numel, numel - 100))
    untouched = torch.cat([buffer[:offset], buffer[offset + numel :]]).cpu()
    assert torch.equal(untouched, torch.full((16,), 7.0, dtype=dtype))


def test_sparse_unpack_merges_in_parallel_chunks_on_the_cpu():
    numel = (1 << 21) + 5  # past the size at which the CPU pass splits over the cores
    values, index = gathered_selections(numel, 20_000, 4, torch.float32, seed=6)
    want = torch.zeros(numel).index_add_(0, index.long(), values) * 0.25
    assert torch.equal(ops.sparse_unpack(values, index, numel, 0.25, out=torch.full((numel,), 7.0)), want)


def test_unpack_into_a_wrong_sized_buffer_is_refused():
    values, index = torch.ones(2), torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"sparse_unpack: out should have numel 5, got 4"):
        ops.sparse_unpack(values, index, 5, out=torch.empty(4))
    with pytest.raises(ValueError, match=r"block_unpack: out should have numel 5, got 6"):
        ops.block_unpack(values, 5, 0, out=torch.empty(6))


@pytest.mark.usefixtures("host_binding")
def test_select_top_keeps_index_order():
    acc = torch.tensor([1.0, -5.0, 2.0, 5.0, -0.5])
    index = torch.tensor([3, 8, 9, 20, 31], dtype=torch.int32)
    a, i = ops.select_top(acc, index, 3)
    assert i.tolist() == [8, 9, 20] and a.tolist() == [-5.0, 2.0, 5.0]


@pytest.mark.usefixtures("host_binding")
def test_select_top_counts_nan_as_inf_and_breaks_that_tie_by_index():
    acc = torch.tensor([1.0, float("inf"), 2.0, float("nan"), -float("inf")])
    index = torch.tensor([3, 5, 7, 9, 11], dtype=torch.int32)
    for k in range(6):
        _, i = ops.select_top(acc, index, k)
        assert i.tolist() == index[reference.topk_mask(acc, k)].tolist(), k


@pytest.mark.usefixtures("host_binding")
def test_ops_pass_opcheck():
    grad = torch.randn(300)
    t = torch.tensor(1.0)
    torch.library.opcheck(
        ops._ops.sample_threshold.default, (grad, torch.zeros(300), torch.zeros(300), 0.9, 0.01, 64, 1, 2, 3)
    )
    torch.library.opcheck(ops._ops.accumulate_candidates.default, (grad, torch.zeros(300), torch.zeros(300), 0.9, t))
    torch.library.opcheck(ops._ops.accumulate_candidates.default, (grad, None, None, 0.0, t))
    acc, index = ops.accumulate_candidates(grad, None, t)
    torch.library.opcheck(ops._ops.select_top.default, (acc, index, 5))
    torch.library.opcheck(
        ops._ops.send_selected.default, (acc, index, torch.zeros(300), torch.zeros(300), True, torch.float16)
    )
    torch.library.opcheck(ops._ops.sparse_unpack.default, (acc, index, 300, 0.5))
    torch.library.opcheck(ops._ops.sparse_unpack_into.default, (acc, index, 0.5, torch.empty(300)))


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda: ops.pack_above(torch.randn(10), torch.zeros(9), 1.0),
            r"residual should have numel 10 like grad, got 9",
        ),
        (
            lambda: ops.pack_above(torch.randn(10), None, 1.0, momentum=torch.zeros(10, dtype=torch.float64)),
            r"momentum should be float32, got Double",
        ),
        (
            lambda: ops.pack_above(torch.arange(10), None, 1.0),
            r"expected a float32, float16 or bfloat16 tensor, got Long",
        ),
        (lambda: ops.sample_threshold(torch.randn(10), None, 1.5), r"ratio should be in \(0, 1\], got 1.5"),
        (
            lambda: ops.sparse_unpack(torch.ones(2), torch.tensor([0, 5], dtype=torch.int32), 5),
            r"index should be in \[0, 5\), got values in \[0, 5\]",
        ),
        (lambda: ops.sparse_unpack(torch.ones(2), torch.tensor([0, 1]), 5), r"index should be a 1-D int32 tensor"),
        (
            lambda: ops.select_top(torch.ones(2), torch.zeros(3, dtype=torch.int32), 1),
            r"acc and index should have the same length, got 2 and 3",
        ),
        (
            lambda: ops.send_selected(
                torch.ones(1), torch.tensor([10], dtype=torch.int32), torch.zeros(10), torch.float32
            ),
            r"index should be in \[0, 10\), got values in \[10, 10\]",
        ),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


@pytest.mark.parametrize("numel,k", [(0, 0), (1, 1), (2, 1), (10, 10), (1000, 100), (1_000_003, 1000), (4097, 33)])
def test_random_k_indices_match_the_reference_and_are_distinct(device, numel, k):
    got = ops.random_k_indices(torch.empty(numel, device=device), k, seed=2**63 + 5, tensor_id=77, step=2**33 + 1)
    assert got.dtype == torch.int32 and got.device.type == device
    want = reference.random_k_indices(2**63 + 5, 77, 2**33 + 1, numel, k)
    assert got.cpu().tolist() == want
    assert len(set(want)) == k and all(0 <= i < numel for i in want)


@pytest.mark.usefixtures("host_binding")
def test_random_k_covers_the_tensor_uniformly_and_changes_every_step():
    numel, k, steps = 100, 10, 3000
    hits = torch.zeros(numel)
    previous = None
    for step in range(steps):
        index = ops.random_k_indices(torch.empty(numel), k, seed=1, tensor_id=2, step=step)
        hits[index.long()] += 1
        assert previous is None or not torch.equal(index, previous)
        previous = index
    expected = steps * k / numel  # 300 per element; binomial sd about 16
    assert hits.min() > expected - 80 and hits.max() < expected + 80, hits


@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_randomk_sends_the_shared_indices_with_error_feedback(device, dtype):
    grad = gradient(5000, dtype, device)
    residual, _ = feedback_state(5000, device)
    acc, u = reference.accumulate(grad.cpu(), residual.cpu())
    index_want = reference.random_k_indices(9, 4, 6, 5000, 50)
    mask = torch.zeros(5000, dtype=torch.bool)
    mask[index_want] = True
    want = reference.send(acc, u, mask, dtype, residual.cpu())
    values, index = ops.pack_randomk(grad, residual, 50, seed=9, tensor_id=4, step=6)
    assert index.cpu().tolist() == index_want
    assert torch.equal(values.cpu(), want[0]) and torch.equal(residual.cpu(), want[2])
    values_plain, _ = ops.pack_randomk(grad, None, 50, seed=9, tensor_id=4, step=6)
    assert torch.equal(values_plain.cpu(), grad.cpu()[index_want])


@pytest.mark.usefixtures("host_binding")
def test_pack_rtopk_picks_k_of_the_exact_top_r():
    gen = torch.Generator().manual_seed(3)
    grad = torch.randn(20_000, generator=gen)
    residual = torch.randn(20_000, generator=gen) * 0.1
    acc, u = reference.accumulate(grad, residual)
    top_r = reference.topk_mask(acc, 400).nonzero().reshape(-1)  # index order
    pick = reference.random_k_indices(5, 8, 1, 400, 40)
    mask = torch.zeros(20_000, dtype=torch.bool)
    mask[top_r[pick]] = True
    want = reference.send(acc, u, mask, torch.float32, residual)
    values, index = ops.pack_rtopk(grad, residual, 400, 40, seed=5, tensor_id=8, step=1)
    assert torch.equal(index.long(), want[1]) and torch.equal(values, want[0]) and torch.equal(residual, want[2])


@pytest.mark.usefixtures("host_binding")
@pytest.mark.parametrize("bits", [1, 2])
@pytest.mark.parametrize("count", [0, 1, 5, 1000])
def test_send_quantized_matches_the_reference_and_keeps_the_error(bits, count):
    gen = torch.Generator().manual_seed(count)
    acc = torch.randn(count, generator=gen) * 3
    index = torch.randperm(5000, generator=gen)[:count].sort().values.int()
    residual = torch.zeros(5000)
    momentum = torch.ones(5000)
    codes, scales = ops.send_quantized(acc, index, residual, bits, momentum=momentum)
    want_codes, want_scales, decoded = reference.quantize(acc, bits)
    assert codes.dtype == torch.uint8 and codes.tolist() == want_codes.tolist()
    assert scales.tolist() == want_scales.tolist()
    assert torch.equal(ops.dequantize(codes, scales, count, bits), torch.from_numpy(decoded))
    # The quantization error stays in the residual; the momentum of sent elements is masked.
    torch.testing.assert_close(residual[index.long()] + torch.from_numpy(decoded), acc, rtol=0, atol=1e-6)
    assert residual.count_nonzero() <= count and momentum[index.long()].count_nonzero() == 0


@pytest.mark.usefixtures("host_binding")
def test_quantization_reduces_the_error_with_more_bits():
    acc = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    index = torch.arange(10_000, dtype=torch.int32)
    errors = []
    for bits in (1, 2):
        codes, scales = ops.send_quantized(acc, index, None, bits)
        errors.append((ops.dequantize(codes, scales, 10_000, bits) - acc).square().mean().item())
    assert errors[1] < 0.5 * errors[0]


@pytest.mark.usefixtures("host_binding")
def test_send_in_half_precision_keeps_the_rounding_error():
    acc = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 1e-3
    index = torch.arange(0, 2000, 2, dtype=torch.int32)
    residual = torch.zeros(2000)
    for dtype in (torch.float16, torch.bfloat16):
        residual.zero_()
        values = ops.send_selected(acc, index, residual, dtype)
        assert values.dtype == dtype and torch.equal(values, acc.to(dtype))
        assert torch.equal(residual[index.long()] + values.float(), acc)


@pytest.mark.usefixtures("host_binding")
def test_quantize_ops_pass_opcheck_and_check_bits():
    acc, index = torch.randn(20), torch.arange(20, dtype=torch.int32)
    torch.library.opcheck(ops._ops.send_quantized.default, (acc, index, torch.zeros(30), None, True, 2))
    codes, scales = ops.send_quantized(acc, index, None, 1)
    torch.library.opcheck(ops._ops.dequantize.default, (codes, scales, 20, 1))
    torch.library.opcheck(ops._ops.random_k_indices.default, (torch.empty(50), 1, 2, 3, 10))
    with pytest.raises(RuntimeError, match="bits should be 1 or 2, got 3"):
        ops.send_quantized(acc, index, None, 3)
    with pytest.raises(RuntimeError, match="codes should have 3 bytes for 20 values of 1 bits, got 4"):
        ops.dequantize(torch.zeros(4, dtype=torch.uint8), scales, 20, 1)


@pytest.mark.usefixtures("host_binding")
@pytest.mark.parametrize(
    "numel,ratio",
    [
        (1000, 0.01),
        (100_000, 0.01),
        (50, 0.1),
        (147_456, 0.001),
        (73_728, 0.01),
        (4096, 0.01),
        (4097, 0.01),
        (3_000_017, 0.01),
    ],
)
@pytest.mark.parametrize(
    "state,dtype",
    [
        ("none", torch.float32),
        ("residual", torch.float32),
        ("momentum", torch.float32),
        ("both", torch.float32),
        ("both", torch.float16),
        ("both", torch.bfloat16),
    ],
)
def test_sampled_threshold_is_the_exact_kth_of_the_documented_sample(numel, ratio, state, dtype):
    """Every plan (strided runs of 1 or 16, or one contiguous stretch: a tensor sampled whole),
    every state (residual, DGC momentum, both, none) and both selections (direct up to 4096
    sampled values, the histogram above): the rank-th largest |acc| of the sample, exactly."""
    gen = torch.Generator().manual_seed(numel)
    grad = torch.randn(numel, generator=gen).to(dtype)
    residual = torch.randn(numel, generator=gen) if state in ("residual", "both") else None
    momentum = torch.randn(numel, generator=gen) if state in ("momentum", "both") else None
    acc, _ = reference.accumulate(grad, residual, momentum, 0.9)
    for step in (0, 3):
        t = ops.sample_threshold(
            grad, residual, ratio, momentum=momentum, momentum_factor=0.9, seed=9, tensor_id=7, step=step
        ).item()
        assert t == reference.sampled_threshold(acc, ratio, 9, 7, step), (step, t)


def _ordered(values, order, gen):
    """`values` rearranged as a gradient might come: magnitudes rising (every value passes a
    running bound), falling, rising after a random half, the largest last, some of the largest
    first and the rest rising, few distinct levels (ties at the k-th), mostly zeros, all equal,
    or with infs and NaNs."""
    numel = values.numel()
    by_magnitude = values[values.abs().argsort()]
    if order == "ascending":
        return by_magnitude
    if order == "descending":
        return by_magnitude.flip(0)
    if order == "ascending after random":
        return torch.cat([values[: numel // 2], values[numel // 2 :][values[numel // 2 :].abs().argsort()]])
    if order == "largest last":  # the 1% largest at the end (the filter's blocks, then its tail of under 16)
        largest = values.abs().argsort(descending=True)[: max(1, numel // 100)]
        rest = torch.ones(numel, dtype=torch.bool)
        rest[largest] = False
        return torch.cat([values[rest], values[largest]])
    if order == "some largest first, then ascending":  # the bound stays low: the filter gives up
        some = max(1, numel // 200)
        return torch.cat([by_magnitude[-some:], by_magnitude[:-some]])
    if order == "few levels":
        return (values * 2).round() / 2
    if order == "mostly zeros":
        return torch.where(torch.rand(numel, generator=gen) < 0.9, torch.zeros(()), values)
    if order == "all equal":
        return torch.full((numel,), -0.5)
    if order == "inf and nan":
        special = torch.tensor([float("inf"), float("-inf"), float("nan")])
        special = special[torch.randint(0, 3, (numel,), generator=gen)]
        return torch.where(torch.rand(numel, generator=gen) < 0.005, special, values)
    return values


@pytest.mark.usefixtures("host_binding")
@pytest.mark.parametrize(
    "numel,ratio", [(4096, 0.01), (4099, 0.01), (16_384, 0.01), (147_456, 0.001), (1_000_003, 0.001), (100_000, 0.01)]
)
@pytest.mark.parametrize(
    "order",
    [
        "random",
        "ascending",
        "descending",
        "ascending after random",
        "largest last",
        "some largest first, then ascending",
        "few levels",
        "mostly zeros",
        "all equal",
        "inf and nan",
    ],
)
def test_sampled_threshold_is_exact_whatever_the_order_of_the_values(numel, ratio, order):
    """The CPU finds a few among many (a tensor sampled whole: rank = ratio * count) by a running
    bound that gives up where the order lets most values pass, the rest by a histogram or one
    nth_element: whichever runs, the rank-th largest magnitude of the sample, exactly."""
    gen = torch.Generator().manual_seed(numel)
    grad = _ordered(torch.randn(numel, generator=gen), order, gen)
    for step in (0, 3):
        t = ops.sample_threshold(grad, None, ratio, seed=9, tensor_id=7, step=step).item()
        expected = reference.sampled_threshold(grad, ratio, 9, 7, step)
        assert t == expected, (step, t, expected)


@pytest.mark.usefixtures("host_binding")
@pytest.mark.parametrize("numel,ratio", [(1000, 0.01), (100_000, 0.01), (1_000_003, 0.001), (50, 0.1), (25, 0.5)])
def test_sampled_threshold_and_selection_follow_the_documented_plan(numel, ratio):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    for step in (0, 3, 2**32 + 1):
        t = ops.sample_threshold(x, None, ratio, seed=9, tensor_id=7, step=step).item()
        assert t == reference.sampled_threshold(x, ratio, 9, 7, step)
        _, index = ops.pack_sampled(x.clone(), torch.zeros(numel), ratio, seed=9, tensor_id=7, step=step)
        assert index.long().tolist() == reference.sampled_mask(x, ratio, 9, 7, step).nonzero().reshape(-1).tolist()
