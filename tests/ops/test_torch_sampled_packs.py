"""The sampled packs of many tensors in one op (pack_sampled_many, through
sparsecomm.torch.sampled_packs): bit for bit what ops.pack_sampled and ops.pack_topk give tensor
by tensor, values, indices and the states after, over steps that carry the state, on the CPU and
the emulated CUDA binding. The op's three band branches are each forced by a plan and checked
against the single ops composed in Python."""

import contextlib

import pytest
import torch

from sparsecomm.core.packing import Plan
from sparsecomm.torch import ops
from sparsecomm.torch.sampled_packs import SampledPacks

# Empty, sampled whole, strided samples at density 0.3 (4,096) and 0.01 (70,000: on the CPU
# only, the emulated CUDA device running a thread at a time).
NUMELS = (0, 1, 5, 300, 4096, 70_000)


def numels():
    """The sizes on this binding (the emulated one swaps ops._ops for its own namespace)."""
    return NUMELS if ops._ops is torch.ops.sparsecomm else NUMELS[:-1]


def grads(dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen).to(dtype).to(device) for n in numels()]


def states(device, momentum):
    zeros = [torch.zeros(n, device=device) for n in numels()]
    return zeros, [z.clone() for z in zeros] if momentum else [None] * len(zeros)


def assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def assert_same_states(ours, theirs):
    for a, b in zip(ours, theirs):
        assert (a is None) == (b is None)
        if a is not None:
            assert_same(a, b)


DGC = dict(momentum_factor=0.9, masking=True)
SAMPLED = {
    "threshold": dict(),
    "threshold_fp16": dict(value_dtype=torch.float16),
    "dgc": DGC,
    "dgc_no_masking": dict(DGC, masking=False),
    "dgc_nesterov": dict(DGC, nesterov=True),
    "dgc_clipped": dict(DGC, clip=True),
}


F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
CASES = [  # (config, gradient dtype, deferred: the DDP bucket's one op; else Horovod's tensor at a time)
    *[("threshold", dtype, True) for dtype in (F32, F16, BF16)],
    ("threshold", F32, False),
    ("threshold_fp16", F32, True),
    ("dgc", F32, True),
    ("dgc", BF16, False),
    ("dgc_no_masking", F32, True),
    ("dgc_nesterov", F16, True),
    ("dgc_clipped", BF16, True),
]


@pytest.mark.parametrize("config,dtype,deferred", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_sampled_packs_equal_pack_sampled_tensor_by_tensor(device, config, dtype, deferred):
    """Three steps at densities 0.01, 0.3 and 1.0 (k = numel: nothing sampled), the state carried."""
    kw = dict(SAMPLED[config])
    clip = kw.pop("clip", False)
    momentum = "momentum_factor" in kw
    batched, one_by_one, packs = states(device, momentum), states(device, momentum), SampledPacks()
    for step, ratio in enumerate((0.01, 0.3, 1.0)):
        gs = grads(dtype, device, seed=step)
        scales = [torch.tensor([0.5 + 0.1 * p], device=device) if clip else None for p in range(len(gs))]
        with packs.deferred() if deferred else contextlib.nullcontext():
            got = [
                packs.sampled(g, r, ratio, sample_ratio=0.01, tensor_id=p, step=step, momentum=m, grad_scale=s, **kw)
                for p, (g, r, m, s) in enumerate(zip(gs, *batched, scales))
            ]
        for p, (g, r, m, s) in enumerate(zip(gs, *one_by_one, scales)):
            values, index = ops.pack_sampled(
                g, r, ratio, sample_ratio=0.01, tensor_id=p, step=step, momentum=m, grad_scale=s, **kw
            )
            assert_same(got[p].values, values)
            assert_same(got[p].index, index)
        for ours, theirs in zip(batched, one_by_one):
            assert_same_states(ours, theirs)


# A bucket of every dtype, with empty and tiny tensors between ones of several candidate tiles
# and (sampled whole: 6,000 and 4,500 samples) of several blocks of the select's digit counts.
MIXED = [(6_000, F32, 1.0), (0, F16, 0.01), (5, BF16, 0.01), (4_500, BF16, 1.0), (1, F32, 0.01), (4_097, F16, 0.01)]


@pytest.mark.parametrize("momentum", [False, True])
def test_a_bucket_of_mixed_dtypes_and_sizes_equals_its_tensors_one_by_one(device, momentum):
    gen = torch.Generator().manual_seed(11)
    kw = dict(momentum_factor=0.9) if momentum else {}
    ours, theirs = ([torch.zeros(n, device=device) for n, _, _ in MIXED] for _ in range(2))
    momenta = [[torch.zeros(n, device=device) if momentum else None for n, _, _ in MIXED] for _ in range(2)]
    packs = SampledPacks()
    for step in range(2):
        gs = [torch.randn(n, generator=gen).to(dtype).to(device) for n, dtype, _ in MIXED]
        with packs.deferred():
            got = [
                packs.sampled(g, r, 0.05, sample_ratio=sr, tensor_id=p, step=step, momentum=m, **kw)
                for p, (g, r, m, (_, _, sr)) in enumerate(zip(gs, ours, momenta[0], MIXED))
            ]
        for p, (g, r, m, (_, _, sr)) in enumerate(zip(gs, theirs, momenta[1], MIXED)):
            values, index = ops.pack_sampled(g, r, 0.05, sample_ratio=sr, tensor_id=p, step=step, momentum=m, **kw)
            assert_same(got[p].values, values)
            assert_same(got[p].index, index)
        assert_same_states(ours, theirs)
        assert_same_states(*momenta)


@pytest.mark.parametrize("error_feedback", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_packs_equal_pack_topk_tensor_by_tensor(device, dtype, error_feedback):
    """k of 0, 1, about 1% and every element, over two steps."""
    ours, one_by_one, packs = states(device, False)[0], states(device, False)[0], SampledPacks()
    if not error_feedback:
        ours = one_by_one = [None] * len(ours)
    for step, k_of in enumerate((lambda n: 0, lambda n: 1, lambda n: n // 100, lambda n: n)):
        gs = grads(dtype, device, seed=10 + step)
        with packs.deferred():
            got = [packs.topk(g, r, k_of(g.numel()), tensor_id=p, step=step) for p, (g, r) in enumerate(zip(gs, ours))]
        for p, (g, r) in enumerate(zip(gs, one_by_one)):
            values, index = ops.pack_topk(g, r, k_of(g.numel()), seed=0, tensor_id=p, step=step)
            assert_same(got[p].values, values)
            assert_same(got[p].index, index)
        assert_same_states(ours, one_by_one)


def composed(grad, residual, momentum, plan, tensor_id, masking=True, bits=None):
    """The op's steps for one tensor, composed from the single ops in Python (bits: the send
    quantized, (codes, scales) for the values)."""
    state = dict(momentum=momentum, momentum_factor=0.9 if momentum is not None else 0.0)
    if plan.sample_count:
        threshold = ops.sample_threshold(grad, residual, plan.ratio, sample_ratio=0.01, tensor_id=tensor_id, **state)
    else:
        threshold = 0.0 if plan.k else float("inf")
    acc, index = ops.accumulate_candidates(grad, residual, threshold, **state)
    if acc.numel() > plan.too_many:
        acc, index = ops.select_top(acc, index, plan.k)
    elif acc.numel() < plan.too_few:
        every = residual if residual is not None else momentum if momentum is not None else grad
        acc, index = ops.select_top(*ops.accumulate_candidates(every, None, 0.0), plan.k)
    if bits is not None:
        return ops.send_quantized(acc, index, residual, bits, momentum=momentum, masking=masking), index
    return ops.send_selected(acc, index, residual, grad.dtype, momentum=momentum, masking=masking), index


BRANCHES = {
    "too_many": lambda plan: Plan(plan.ratio, plan.sample_count, plan.k, 0, -1),  # every count is above
    "too_few": lambda plan: Plan(plan.ratio, plan.sample_count, plan.k, 10**9, 10**9),  # every count is below
    "kept": lambda plan: Plan(plan.ratio, plan.sample_count, plan.k, 0, 10**9),
}


@pytest.mark.parametrize("branch", list(BRANCHES))
@pytest.mark.parametrize("momentum", [False, True])
def test_each_band_branch_composes_the_single_ops(device, branch, momentum):
    gs = grads(torch.float32, device, seed=3)
    ours, theirs = states(device, momentum), states(device, momentum)
    plans = [BRANCHES[branch](Plan.sampled(g.numel(), 0.05, 0.01)) for g in gs]
    flat = [x for p, plan in enumerate(plans) for x in (plan.k, plan.sample_count, plan.too_few, plan.too_many, p, 0)]
    values, indices = ops.pack_sampled_many(
        gs, ours[0], ours[1], 0.9 if momentum else 0.0, [None] * len(gs), False, True, [0.05] * len(gs), flat, 0, None
    )
    for p, (g, r, m, plan) in enumerate(zip(gs, *theirs, plans)):
        want_values, want_index = composed(g, r, m, plan, p)
        assert_same(values[p], want_values)
        assert_same(indices[p], want_index)
        if branch != "kept":
            assert indices[p].numel() == plan.k
    assert_same_states(ours[0], theirs[0])
    assert_same_states(ours[1], theirs[1])


@pytest.mark.parametrize("deferred", [True, False], ids=["bucket", "tensor_at_a_time"])
@pytest.mark.parametrize("variant", ["plain", "nesterov", "clipped"])
def test_dense_momentum_steps_equal_momentum_step_tensor_by_tensor(device, variant, deferred):
    """DGC's dense route (SampledPacks.momentum_step): a bucket of every dtype and size, over two
    steps, the gradients written in place and the momenta carried, as ops.momentum_step gives."""
    gen = torch.Generator().manual_seed(12)
    ours, theirs = ([torch.zeros(n, device=device) for n, _, _ in MIXED] for _ in range(2))
    packs = SampledPacks()
    for _ in range(2):
        gs = [torch.randn(n, generator=gen).to(dtype).to(device) for n, dtype, _ in MIXED]
        want = [g.clone() for g in gs]
        scales = [
            torch.tensor([0.5 + 0.1 * p], device=device) if variant == "clipped" else None for p in range(len(gs))
        ]
        kw = dict(momentum_factor=0.9, nesterov=variant == "nesterov")
        with packs.deferred() if deferred else contextlib.nullcontext():
            got = [packs.momentum_step(g, m, grad_scale=s, **kw) for g, m, s in zip(gs, ours, scales)]
            assert all((p._values is None) == deferred for p in got)  # queued in a bucket, made at once else
        for g, m, s in zip(want, theirs, scales):
            ops.momentum_step(g, m, grad_scale=s, **kw)
        for p, g, w in zip(got, gs, want):
            assert p.values is g and p.index is None
            assert_same(g, w)
        assert_same_states(ours, theirs)


def test_momentum_steps_of_the_wrong_length_or_strided_are_refused(device):
    g, m = torch.randn(10, device=device), torch.zeros(10, device=device)
    with pytest.raises(RuntimeError, match=r"momenta and grad_scales should hold one entry per grad \(1\), got 2"):
        ops.momentum_step_many([g], [m, m], 0.9)
    strided = torch.randn(10, 2, device=device)[:, 0]
    with pytest.raises(RuntimeError, match="grads should be contiguous .* grad 1 is not"):
        ops.momentum_step_many([g, strided], [m, m], 0.9)


def test_the_momentum_steps_pass_opcheck():
    torch.library.opcheck(
        torch.ops.sparsecomm.momentum_step_many.default,
        ([torch.randn(5), torch.randn(3)], [torch.zeros(5), torch.zeros(3)], 0.9, [None, None], False),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


def test_arguments_of_the_wrong_length_are_refused(device):
    g = torch.randn(10, device=device)
    with pytest.raises(RuntimeError, match="residuals, momenta, grad_scales and ratios should hold one entry per grad"):
        ops.pack_sampled_many([g], [None, None], [None], 0.0, [None], False, True, [0.1], [1, 0, 1, 1, 0, 0], 0, None)
    with pytest.raises(RuntimeError, match=r"plans should hold 6 numbers .* got 5 for 1 grads"):
        ops.pack_sampled_many([g], [None], [None], 0.0, [None], False, True, [0.1], [1, 0, 1, 1, 0], 0, None)
    with pytest.raises(RuntimeError, match=r"^pack_sampled_fixed: residuals, momenta, grad_scales and ratios"):
        ops.pack_sampled_fixed([g], [None, None], [None], 0.0, [None], False, True, [0.1], [1, 0, 1, 1, 0, 0], 0, None)


def test_an_error_in_a_deferred_block_still_runs_the_queued_packs(device):
    """The state of a queued tensor is updated whatever ends the block."""
    packs, residual = SampledPacks(), torch.zeros(100, device=device)
    with pytest.raises(ZeroDivisionError), packs.deferred():
        packed = packs.sampled(torch.ones(100, device=device), residual, 0.1, sample_ratio=0.01, tensor_id=0, step=0)
        raise ZeroDivisionError
    assert packed.index.numel() == 10 and residual.abs().sum() > 0


def test_the_op_passes_opcheck_but_aot_dispatch():
    """Not test_aot_dispatch_*: torch's functionalization takes no custom op that both mutates a
    list and returns lists. The DDP hook runs it eagerly (a hook is not traced)."""
    gs = [torch.randn(50), torch.randn(7)]
    plans = [x for g in gs for x in (5, g.numel(), 4, 6, 0, 0)]
    args = (
        gs,
        [torch.zeros(50), torch.zeros(7)],
        [None, None],
        0.0,
        [None, None],
        False,
        True,
        [0.1, 0.1],
        plans,
        0,
        None,
    )
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.sparsecomm.pack_sampled_many.default, args, test_utils=checks)


def test_a_pack_read_inside_a_deferred_block_is_made_first(device):
    """Reading a queued pack runs the queue (the loss scaler and the network calibration read
    theirs inside a DDP bucket's block); packs queued after it still run at the block's end."""
    packs, gs = SampledPacks(), grads(torch.float32, device, seed=5)[3:5]
    ours, theirs = [torch.zeros_like(g) for g in gs], [torch.zeros_like(g) for g in gs]
    with packs.deferred():
        first = packs.sampled(gs[0], ours[0], 0.1, sample_ratio=0.01, tensor_id=0, step=0)
        assert first.index.numel() == 30 and ours[0].abs().sum() > 0
        second = packs.topk(gs[1], ours[1], 41, tensor_id=1, step=0)
        assert second._index is None  # queued
    want = [
        ops.pack_sampled(gs[0], theirs[0], 0.1, sample_ratio=0.01, tensor_id=0, step=0),
        ops.pack_topk(gs[1], theirs[1], 41, seed=0, tensor_id=1, step=0),
    ]
    for got, (values, index) in zip((first, second), want):
        assert_same(got.values, values)
        assert_same(got.index, index)
    assert_same_states(ours, theirs)


# A bucket's CUDA kernels, counted by the emulation (sparsecomm's own: torch's ops inside the
# binding run on the CPU there and are not counted), for gradients of 4,096 elements at 1%: the
# sampled packs' 14 (csrc/cuda/segments.cu: the sample's gather, the select's start and its 4
# digits of 2 launches each, the state pass, the totals, the compaction, the sends; TopK's exact
# top k of its candidates one more) and the wire rows' 1, whatever the number of tensors.
LAUNCHES_PER_BUCKET = {"dgc": 15, "threshold": 15, "topk": 16}
# At fixed capacity (pack_sampled_fixed, DDP's): the same first phase and sends, the compaction into
# each tensor's room, then one kernel that decides each band and selects (fixed_tops), for every method.
FIXED_LAUNCHES_PER_BUCKET = {"dgc": 16, "threshold": 16, "topk": 16}


def bucket_launches(method, tensors, fixed):
    """The kernels a bucket of `tensors` gradients of 4,096 elements launches for its packs and rows
    (ops routed to the emulated binding), at fixed capacity (DDP's) or not."""
    launched = torch.ops.sparsecomm_cuda_emulation.launches
    gs = [torch.randn(4096, generator=torch.Generator().manual_seed(i)) for i in range(tensors)]
    residuals, momenta = [torch.zeros(4096) for _ in gs], [torch.zeros(4096) if method == "dgc" else None for _ in gs]
    packs, before = SampledPacks(), launched()
    with packs.deferred(fixed):
        if method == "topk":
            made = [packs.topk(g, r, 41, tensor_id=i, step=0) for i, (g, r) in enumerate(zip(gs, residuals))]
        else:
            feedback = dict(momentum_factor=0.9) if method == "dgc" else {}
            made = [
                packs.sampled(g, r, 0.01, sample_ratio=0.01, tensor_id=i, step=0, momentum=m, **feedback)
                for i, (g, r, m) in enumerate(zip(gs, residuals, momenta))
            ]
    chunk = torch.zeros(tensors * (4096 + 1) * 8, dtype=torch.uint8)  # room for every element's row
    if fixed:
        values, indices, counts = zip(*(p.fixed for p in made))
        places = [(8 * i, 8 * tensors + i * 4096 * 8, 4096) for i in range(tensors)]
        ops.wire_rows_fixed_into(values, indices, torch.cat(counts), places, out=chunk)
    else:
        places = [(i * 4096 * 8, 4096) for i in range(tensors)]
        ops.wire_rows_many_into([p.values for p in made], [p.index for p in made], places, out=chunk)
    return launched() - before


# (the id names the device, so that `-k "not cuda"`, the CPU self-check's selection, leaves them out)
ON_THE_EMULATION = pytest.mark.parametrize("device", ["cuda-emulated"], indirect=True)


@ON_THE_EMULATION
@pytest.mark.parametrize("fixed", [False, True], ids=["counted", "fixed"])
@pytest.mark.parametrize("method", sorted(LAUNCHES_PER_BUCKET))
def test_a_bucket_launches_the_same_kernels_whatever_its_number_of_tensors(method, fixed, device):
    """One tensor, 4 and ResNet-50's 161 (docs/kernels.md, "Launches")."""
    want = (FIXED_LAUNCHES_PER_BUCKET if fixed else LAUNCHES_PER_BUCKET)[method]
    assert [bucket_launches(method, tensors, fixed) for tensors in (1, 4, 161)] == [want] * 3


def dense_launches(tensors):
    """The kernels a bucket of `tensors` gradients of 512 elements on DGC's dense route launches."""
    launched = torch.ops.sparsecomm_cuda_emulation.launches
    gs, momenta = [torch.randn(512) for _ in range(tensors)], [torch.zeros(512) for _ in range(tensors)]
    packs, before = SampledPacks(), launched()
    with packs.deferred():
        for g, m in zip(gs, momenta):
            packs.momentum_step(g, m, momentum_factor=0.9)
    return launched() - before


@ON_THE_EMULATION
def test_a_bucket_of_dense_momentum_steps_is_one_launch(device):
    assert [dense_launches(tensors) for tensors in (1, 4, 161)] == [1, 1, 1]


# --- fixed capacity (pack_sampled_fixed): the same selections in rooms of a fixed size ---

FIXED_BRANCHES = {  # (numel, plan of it): each of the device's four decisions
    "inside": (5_000, lambda plan: Plan(plan.ratio, plan.sample_count, plan.k, 0, 10**9)),
    "above": (5_000, lambda plan: Plan(plan.ratio, plan.sample_count, plan.k, 0, -1)),
    "above_its_room": (20_000, lambda plan: Plan(0.5, plan.sample_count, 10, 0, -1)),  # 10,000 of a room of 4,116
    "below": (5_000, lambda plan: Plan(plan.ratio, plan.sample_count, plan.k, 10**9, 10**9)),
    "as_planned": (5_000, lambda plan: plan),
}


def flat_plans(plans, first_id=0):
    return [
        x
        for p, plan in enumerate(plans)
        for x in (plan.k, plan.sample_count, plan.too_few, plan.too_many, first_id + p, 0)
    ]


def fixed_and_many(gs, plans, momentum, dtype=None):
    """pack_sampled_fixed and pack_sampled_many of the same bucket, each on its own copy of the state:
    (fixed's (values, index, counts, residuals, momenta), many's (values, index, residuals, momenta))."""
    out = []
    for op in (ops.pack_sampled_fixed, ops.pack_sampled_many):
        residuals = [torch.zeros(g.numel(), device=g.device) for g in gs]
        momenta = [torch.zeros(g.numel(), device=g.device) if momentum else None for g in gs]
        made = op(
            gs,
            residuals,
            momenta,
            0.9 if momentum else 0.0,
            [None] * len(gs),
            False,
            True,
            [plan.ratio for plan in plans],
            flat_plans(plans),
            0,
            dtype,
        )
        out.append((*made, residuals, momenta))
    return out


@pytest.mark.parametrize("branch", list(FIXED_BRANCHES))
@pytest.mark.parametrize("momentum", [False, True])
def test_fixed_capacity_packs_equal_pack_sampled_many(device, branch, momentum):
    numel, plan_of = FIXED_BRANCHES[branch]
    gen = torch.Generator().manual_seed(21)
    gs = [torch.randn(n, generator=gen).to(device) for n in (numel, 0, 7)]
    plans = [plan_of(Plan.sampled(g.numel(), 0.05, 0.01)) for g in gs]
    (values, indices, counts, *fixed_states), (want_values, want_indices, *states) = fixed_and_many(gs, plans, momentum)
    assert counts.dtype == torch.int64 and counts.tolist() == [i.numel() for i in want_indices]
    for g, plan, v, i, c, wv, wi in zip(gs, plans, values, indices, counts.tolist(), want_values, want_indices):
        assert v.numel() == i.numel() == min(g.numel(), max(plan.k, plan.too_many))
        assert_same(v[:c], wv)
        assert_same(i[:c], wi)
    for ours, theirs in zip(fixed_states, states):
        assert_same_states(ours, theirs)


def test_fixed_capacity_topk_and_mixed_dtypes_equal_pack_sampled_many(device):
    gen = torch.Generator().manual_seed(22)
    gs = [torch.randn(n, generator=gen).to(dtype).to(device) for n, dtype, _ in MIXED]
    plans = [Plan.top(g.numel(), max(1, g.numel() // 50), 0.01) for g in gs]
    for value_dtype in (None, torch.float16):
        (values, indices, counts, *_), (want_values, want_indices, *_) = fixed_and_many(gs, plans, False, value_dtype)
        for v, i, c, wv, wi in zip(values, indices, counts.tolist(), want_values, want_indices):
            assert_same(v[:c], wv)
            assert_same(i[:c], wi)


def test_fixed_capacity_rows_equal_the_rows_of_the_counts(device):
    """wire_rows_fixed_into writes each send's rows and its number of rows, as wire_rows_many_into
    writes the rows of the sends cut to their counts."""
    gen = torch.Generator().manual_seed(23)
    gs = [torch.randn(n, generator=gen).to(device) for n in (max(numels()), 0, 300)]
    plans = [Plan.sampled(g.numel(), 0.05, 0.01) for g in gs]
    (values, indices, counts, *_), _ = fixed_and_many(gs, plans, False)
    width = 2 + 4
    sizes = [(v.numel() + -(-g.numel() // 65536)) * width for v, g in zip(values, gs)]
    places, at = [], 8 * len(gs)
    for p, size in enumerate(sizes):
        places.append((8 * p, at, gs[p].numel()))
        at += size
    fixed = ops.wire_rows_fixed_into(
        values, indices, counts, places, out=torch.zeros(at, dtype=torch.uint8, device=device)
    )
    cut = [c for c in counts.tolist()]
    want = ops.wire_rows_many_into(
        [v[:c] for v, c in zip(values, cut)],
        [i[:c] for i, c in zip(indices, cut)],
        [(offset, length) for _, offset, length in places],
        out=torch.zeros(at, dtype=torch.uint8, device=device),
    )
    rows = [c + -(-g.numel() // 65536) for c, g in zip(cut, gs)]
    assert fixed[: 8 * len(gs)].view(torch.int64).tolist() == rows
    assert_same(fixed[8 * len(gs) :], want[8 * len(gs) :])


@ON_THE_EMULATION
def test_a_fixed_capacity_bucket_reads_nothing_on_the_host(device):
    """pack_sampled_fixed and wire_rows_fixed_into: no read of device data by the binding
    (pack_sampled_many's one read of the bucket's counts is the counter's control)."""
    reads = torch.ops.sparsecomm_cuda_emulation.host_reads
    gs = [torch.randn(4096, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    plans = [Plan.sampled(4096, 0.01, 0.01) for _ in gs]
    before = reads()
    (values, indices, counts, *_), _ = fixed_and_many(gs, plans, True)
    after_packs = reads()
    places = [(8 * p, 32 + p * 4096 * 6, 4096) for p in range(4)]
    ops.wire_rows_fixed_into(values, indices, counts, places, out=torch.zeros(32 + 4 * 4096 * 6, dtype=torch.uint8))
    assert (after_packs - before, reads() - after_packs) == (1, 0)  # the 1: pack_sampled_many's, run second


# --- DGC's clipping factors, a bucket's in one op ---

CLIP_SIZES = [(6_000, F32), (0, F16), (5, BF16), (4_500, BF16), (1, F32), (70_000, F16)]  # (several square tiles)


@pytest.mark.parametrize("deferred", [True, False], ids=["bucket", "tensor_at_a_time"])
def test_clipping_factors_equal_the_norm_formula_tensor_by_tensor(device, deferred):
    """torch.where(norm > limit, limit / norm, 1.0).float() with norm = sum_of_squares(g).sqrt():
    below, at and above the limit, an empty gradient (norm 0), NaN (factor 1) and inf (0)."""
    gen = torch.Generator().manual_seed(31)
    gs = [torch.randn(n, generator=gen).to(dtype).to(device) for n, dtype in CLIP_SIZES]
    gs[4][0] = float("inf")
    gs[2][1] = float("nan")
    limits = [0.5, 1.0, 1.0, 1e9, 0.25, float(ops.sum_of_squares(gs[5]).sqrt())]  # (the last: at its norm)
    more = [torch.randn(300, generator=gen).to(device) for _ in range(16)]  # clipped: limit / norm's rounding
    gs, limits = gs + more, limits + [0.1 * (1 + p) for p in range(16)]
    packs = SampledPacks()
    with packs.deferred() if deferred else contextlib.nullcontext():
        got = [packs.clip_factor(g, limit) for g, limit in zip(gs, limits)]
    for g, limit, factor in zip(gs, limits, got):
        norm = ops.sum_of_squares(g).sqrt()
        assert_same(factor.reshape(1), torch.where(norm > limit, limit / norm, 1.0).float().reshape(1))
    assert [float(f) for f in got[1:6]] == [1.0, 1.0, 1.0, 0.0, 1.0]  # (an inf norm: limit * (1 / inf))
    assert 0.0 < float(got[0]) < 1.0


def test_clipping_factors_refuse_a_wrong_length_and_pass_opcheck(device):
    g = torch.randn(10, device=device)
    with pytest.raises(RuntimeError, match=r"limits and factors should hold one entry per grad \(1\), got 2 and 1"):
        ops.clip_factors_into([g], [1.0, 2.0], [torch.empty((), device=device)])
    with pytest.raises(RuntimeError, match="factors should be 1-element float32 tensors, got 2 Float"):
        ops.clip_factors_into([g], [1.0], [torch.empty(2, device=device)])
    torch.library.opcheck(
        torch.ops.sparsecomm.clip_factors_into.default,
        ([torch.randn(5), torch.randn(3)], [0.5, 9.0], [torch.empty(()), torch.empty(())]),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


@ON_THE_EMULATION
def test_a_bucket_of_clipping_factors_is_two_launches(device):
    launched = torch.ops.sparsecomm_cuda_emulation.launches
    for tensors in (1, 4, 161):
        packs, before = SampledPacks(), launched()
        with packs.deferred():
            for _ in range(tensors):
                packs.clip_factor(torch.randn(512), 1.0)
        assert launched() - before == 2


# --- rTop-k where a read waits: the state pass, then the exact top r at fixed capacity ---

RTOPK = {  # numel -> (r, k) of each step: r above k, r equal to k, r and k past every element
    n: [(max(1, n // 10), max(1, n // 100)), (max(1, n // 50), max(1, n // 50)), (n + 3, n + 1)] for n in NUMELS[:-1]
}


@pytest.mark.parametrize("deferred", [True, False], ids=["bucket", "tensor_at_a_time"])
@pytest.mark.parametrize("error_feedback", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rtopk_packs_equal_pack_rtopk(device, dtype, error_feedback, deferred):
    """SampledPacks.rtopk (a bucket of every size at once, or a tensor at a time): values, indices
    and residuals bit for bit as ops.pack_rtopk's, over three steps that carry the residual."""
    gen, packs, sizes = torch.Generator().manual_seed(5), SampledPacks(), list(RTOPK)
    ours, theirs = ([torch.zeros(n, device=device) for n in sizes] for _ in range(2))
    if not error_feedback:
        ours = theirs = [None] * len(sizes)
    for step in range(3):
        gs = [torch.randn(n, generator=gen).to(dtype).to(device) for n in sizes]
        streams = [dict(seed=2**63 + 7, tensor_id=n, step=step) for n in sizes]
        with packs.deferred() if deferred else contextlib.nullcontext():
            got = [packs.rtopk(g, o, *RTOPK[n][step], **s) for g, o, n, s in zip(gs, ours, sizes, streams)]
        for g, t, n, s, packed in zip(gs, theirs, sizes, streams, got):
            values, index = ops.pack_rtopk(g, t, *RTOPK[n][step], **s)
            assert_same(packed.values, values)
            assert_same(packed.index, index)
        assert_same_states(ours, theirs)


@ON_THE_EMULATION
def test_a_bucket_of_rtopk_packs_reads_nothing_on_the_host(device):
    """SampledPacks.rtopk reads nothing back; ops.pack_rtopk (its top's count) is the control."""
    reads, packs = torch.ops.sparsecomm_cuda_emulation.host_reads, SampledPacks()
    gs = [torch.randn(4096, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    stream = dict(seed=1, tensor_id=0, step=0)
    before = reads()
    with packs.deferred():
        for g in gs:
            packs.rtopk(g, torch.zeros(4096), 400, 40, **stream)
    between = reads()
    ops.pack_rtopk(gs[0], torch.zeros(4096), 400, 40, **stream)
    assert (between - before, reads() - between > 0) == (0, True)
