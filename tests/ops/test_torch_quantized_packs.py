"""A DDP bucket's 1-/2-bit packs at fixed capacity (pack_quantized_fixed, through
sparsecomm.torch.sampled_packs), their fixed-layout segments (quantized_segments_fixed_into) and the
unpack of every rank's (sparse_unpack_gathered_segments): bit for bit what the per-tensor path gives
(ops.pack_sampled(bits=...), ops.quantized_segment, ops.sparse_unpack_segments), on the CPU and the
emulated CUDA binding; the bucket's launches, its reads on the host, and the arguments refused."""

import numpy as np
import pytest
import reference
import torch
from cases import DTYPES
from test_torch_sampled_packs import FIXED_BRANCHES, ON_THE_EMULATION, assert_same, assert_same_states, composed

from sparsecomm.core import wire
from sparsecomm.core.packing import Plan
from sparsecomm.torch import ops
from sparsecomm.torch.sampled_packs import SampledPacks

# Empty, one element, sampled whole, strided samples (4,096), and 70,000 (two wire buckets; on the
# CPU only: the emulated CUDA device runs a thread at a time).
NUMELS = (0, 1, 5, 300, 4096, 70_000)


def numels():
    return NUMELS if ops._ops is torch.ops.sparsecomm else NUMELS[:-1]


def gradients(dtype, device, seed):
    """Seeded normal gradients, with a NaN, +inf and -inf in those that hold them."""
    gen = torch.Generator().manual_seed(seed)
    gs = [torch.randn(n, generator=gen) for n in numels()]
    for g in gs[3:]:
        g[[7, 100, 200]] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    return [g.to(dtype).to(device) for g in gs]


def segment_bytes(room, bits, numel):
    return wire.Segment(room, wire.scale_count(bits), bits, numel).size


def chunk_of(packs, bits, fill=0xAB):
    """The fixed segments of `packs` (Packed.fixed's) written into one chunk after a header of
    counts, its other bytes `fill`: (chunk, places, regions) of quantized_segments_fixed_into and
    sparse_unpack_gathered_segments."""
    fixeds, sizes = zip(*packs)
    codes, scales, indices, counts = (list(part) for part in zip(*fixeds))
    places, regions, at = [], [], 8 * len(packs)
    for p, (index, numel) in enumerate(zip(indices, sizes)):
        places.append((8 * p, at, numel))
        regions.append((at, index.numel()))
        at += segment_bytes(index.numel(), bits, numel)
    chunk = torch.full((at,), fill, dtype=torch.uint8, device=indices[0].device if indices else "cpu")
    ops.quantized_segments_fixed_into(codes, scales, indices, torch.cat(counts), bits, places, out=chunk)
    return chunk, places, regions


CONFIGS = {
    "threshold": {},
    "dgc": dict(momentum_factor=0.9, masking=True),
    "dgc_no_masking": dict(momentum_factor=0.9, masking=False),
}
CASES = [
    *[("threshold", dtype, bits) for dtype in DTYPES for bits in (1, 2)],
    ("dgc", torch.float32, 1),
    ("dgc", torch.bfloat16, 2),
    ("dgc_no_masking", torch.float16, 2),
]


@pytest.mark.parametrize("config,dtype,bits", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_a_bucket_of_quantized_packs_equals_pack_sampled_and_quantized_segment(device, config, dtype, bits):
    """Three steps at densities 0.01, 0.3 and 1.0, the state carried: each tensor's codes, scales
    and index (up to its count), its residual and momentum, and its fixed segment's parts, as the
    tensor-at-a-time ops give them; nothing written past the count."""
    kw = CONFIGS[config]
    momentum = "momentum_factor" in kw
    states = [[torch.zeros(n, device=device) for n in numels()] for _ in range(2)]
    momenta = [[torch.zeros(n, device=device) if momentum else None for n in numels()] for _ in range(2)]
    packs = SampledPacks()
    for step, ratio in enumerate((0.01, 0.3, 1.0)):
        gs = gradients(dtype, device, seed=step)
        stream = dict(sample_ratio=0.01, step=step, bits=bits, **kw)
        with packs.deferred(fixed=True):
            got = [
                packs.sampled(g, r, ratio, tensor_id=p, momentum=m, **stream)
                for p, (g, r, m) in enumerate(zip(gs, states[0], momenta[0]))
            ]
        chunk, places, _ = chunk_of([(q.fixed, g.numel()) for q, g in zip(got, gs)], bits)
        for p, (g, r, m) in enumerate(zip(gs, states[1], momenta[1])):
            (codes, scales), index = ops.pack_sampled(g, r, ratio, tensor_id=p, momentum=m, **stream)
            fixed_codes, fixed_scales, fixed_index, count = got[p].fixed
            assert count.dtype == torch.int64 and int(count) == index.numel() <= fixed_index.numel()
            assert fixed_codes.numel() == wire.code_bytes(fixed_index.numel(), bits)
            assert_same(fixed_codes[: codes.numel()], codes)
            assert_same(fixed_scales, scales)
            assert_same(fixed_index[: index.numel()], index)
            assert got[p].scales is fixed_scales  # (needs no cut)
            assert_same(got[p].codes, codes)  # (cut to the count when read)
            segment = ops.quantized_segment(codes, scales, index, bits, g.numel())
            assert_fixed_segment(chunk, places[p], fixed_index.numel(), segment, bits)
        assert_same_states(states[0], states[1])
        assert_same_states(momenta[0], momenta[1])


def assert_fixed_segment(chunk, place, room, segment, bits):
    """The fixed segment at `place` (count slot, offset, numel) of `chunk`, laid out for `room`,
    holds the parts of the tensor's own `segment` (laid out for its count); its count is also in
    the header's slot; every other byte of its region is as the chunk was filled (0xAB)."""
    slot, at, numel = place
    count = int(segment[:8].view(torch.int64))
    tight, fixed = (wire.Segment(n, wire.scale_count(bits), bits, numel) for n in (count, room))
    got, written = chunk[at : at + fixed.size], torch.zeros(fixed.size, dtype=torch.bool, device=chunk.device)
    for (start, end), want_at in (
        ((0, tight.offsets + 2 * count), 0),  # the count, the scales and the bucket counts, the offsets
        ((fixed.codes, fixed.codes + wire.code_bytes(count, bits)), tight.codes),  # the codes
    ):
        assert_same(got[start:end], segment[want_at : want_at + end - start])
        written[start:end] = True
    assert_same(chunk[slot : slot + 8], segment[:8])
    assert bool((got[~written] == 0xAB).all())


@pytest.mark.parametrize("bits", [1, 2])
@pytest.mark.parametrize("branch", list(FIXED_BRANCHES))
@pytest.mark.parametrize("momentum", [False, True])
def test_each_band_branch_sends_as_the_single_ops_compose(device, branch, momentum, bits):
    """pack_quantized_fixed in each of the device's decisions (forced by the plan): the selection
    and the quantized send of the single ops, the states after them."""
    numel, plan_of = FIXED_BRANCHES[branch]
    gen = torch.Generator().manual_seed(41)
    gs = [torch.randn(n, generator=gen).to(device) for n in (numel, 0, 7)]
    plans = [plan_of(Plan.sampled(g.numel(), 0.05, 0.01)) for g in gs]
    ours, theirs = ([torch.zeros(g.numel(), device=device) for g in gs] for _ in range(2))
    mom = [[torch.zeros(g.numel(), device=device) if momentum else None for g in gs] for _ in range(2)]
    flat = [x for p, plan in enumerate(plans) for x in (plan.k, plan.sample_count, plan.too_few, plan.too_many, p, 0)]
    codes, scales, indices, counts = ops.pack_quantized_fixed(
        gs, ours, mom[0], 0.9 if momentum else 0.0, [None] * 3, False, True, [p.ratio for p in plans], flat, 0, bits
    )
    for p, (g, r, m, plan) in enumerate(zip(gs, theirs, mom[1], plans)):
        (want_codes, want_scales), want_index = composed(g, r, m, plan, p, bits=bits)
        count = int(counts[p])
        assert count == want_index.numel() and indices[p].numel() == min(g.numel(), max(plan.k, plan.too_many))
        assert_same(codes[p][: want_codes.numel()], want_codes)
        assert_same(scales[p], want_scales)
        assert_same(indices[p][:count], want_index)
    assert_same_states(ours, theirs)
    assert_same_states(*mom)


# Each tensor's rank counts (3 ranks), past 65,535 elements a tensor of two buckets: one rank that
# sent nothing, one that filled its room, and an empty tensor.
UNPACKED = [(70_000, 3_000, (2_000, 0, 3_000)), (300, 20, (20, 7, 13)), (0, 0, (0, 0, 0)), (5, 5, (5, 1, 0))]


def ranks_chunks(bits, seed, device):
    """Each rank's chunk of the UNPACKED tensors (their fixed segments over random bytes: garbage
    past each count) and each rank's tensor segments (ops.quantized_segment of its count)."""
    gen, chunks, segments = torch.Generator().manual_seed(seed), [], []
    for r in range(3):
        packs, mine = [], []
        for t, (numel, room, counts) in enumerate(UNPACKED):
            codes, scales, _, index = reference.quantized_ranks(numel, [counts[r]], bits, seed=seed + 10 * r + t)[0]
            garbage = torch.randint(0, 256, (wire.code_bytes(room, bits),), dtype=torch.uint8, generator=gen)
            garbage[: codes.size] = torch.from_numpy(codes)
            full_index = torch.randint(-9, 2**31 - 1, (room,), dtype=torch.int32, generator=gen)
            full_index[: index.size] = torch.from_numpy(index)
            count = torch.tensor([counts[r]])
            tensors = [x.to(device) for x in (garbage, torch.from_numpy(scales), full_index, count)]
            packs.append((tuple(tensors), numel))
            mine.append(torch.from_numpy(reference.quantized_segment(codes, scales, index, numel)).to(device))
        chunk, _, regions = chunk_of(packs, bits, fill=int(torch.randint(0, 256, (1,), generator=gen)))
        chunks.append(chunk)
        segments.append(mine)
    return torch.stack(chunks), regions, segments


@pytest.mark.parametrize("bits", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale,divisor", [(1.0, 3), (0.25, 1)])
def test_the_gathered_segments_unpack_as_sparse_unpack_segments(device, bits, dtype, scale, divisor):
    """3 ranks of different counts (0 and a full room among them), garbage past each count: every
    tensor's sum in rank order, scaled, into stale outs (views of one bucket), as
    sparse_unpack_segments gives it from the ranks' own segments."""
    gathered, regions, segments = ranks_chunks(bits, seed=bits, device=device)
    bucket = torch.full((sum(n for n, _, _ in UNPACKED),), 7.0, dtype=dtype, device=device)
    outs = list(bucket.split([n for n, _, _ in UNPACKED]))
    given = torch.tensor([scale], device=device)
    ops.sparse_unpack_gathered_segments(gathered, regions, bits, given, divisor, outs=outs)
    for t, (numel, _, _) in enumerate(UNPACKED):
        want = torch.full((numel,), 7.0, dtype=dtype, device=device)
        ops.sparse_unpack_segments(torch.cat([s[t] for s in segments]), bits, 3, numel, given, divisor, out=want)
        assert_same(outs[t], want)


def test_the_quantized_bucket_ops_pass_opcheck():
    """pack_quantized_fixed: not test_aot_dispatch_* (torch's functionalization takes no custom op
    that both mutates a list and returns lists; the hook runs it eagerly)."""
    gs = [torch.randn(50), torch.randn(7)]
    plans = [x for g in gs for x in (5, g.numel(), 4, 6, 0, 0)]
    states = [torch.zeros(50), torch.zeros(7)]
    args = (gs, states, [None, None], 0.0, [None, None], False, True, [0.1, 0.1], plans, 0, 2)
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.sparsecomm.pack_quantized_fixed.default, args, test_utils=checks)
    codes, scales, indices, counts = ops.pack_quantized_fixed(*args)
    fixed = zip(codes, scales, indices, counts.split(1))
    chunk, places, regions = chunk_of([(f, g.numel()) for f, g in zip(fixed, gs)], 2)
    flat = [x for place in places for x in place]
    write = (codes, scales, indices, counts, 2, flat, chunk)
    torch.library.opcheck(torch.ops.sparsecomm.quantized_segments_fixed_into.default, write)
    flat = [x for region in regions for x in region]
    unpack = (torch.stack([chunk, chunk]), flat, 2, torch.tensor([0.5]), 2, [torch.empty(50), torch.empty(7)])
    torch.library.opcheck(torch.ops.sparsecomm.sparse_unpack_gathered_segments_into.default, unpack)


def quantized_launches(tensors):
    """The kernels a bucket of `tensors` gradients of 4,096 elements launches for its 2-bit packs
    and their segments, and for the unpack of two ranks' chunks (ops routed to the emulated binding)."""
    launched = torch.ops.sparsecomm_cuda_emulation.launches
    gs = [torch.randn(4096, generator=torch.Generator().manual_seed(i)) for i in range(tensors)]
    packs, residuals, before = SampledPacks(), [torch.zeros(4096) for _ in gs], launched()
    with packs.deferred(fixed=True):
        made = [
            packs.sampled(g, r, 0.01, sample_ratio=0.01, tensor_id=i, step=0, bits=2)
            for i, (g, r) in enumerate(zip(gs, residuals))
        ]
    chunk, _, regions = chunk_of([(p.fixed, 4096) for p in made], 2)
    packed = launched()
    outs = list(torch.empty(4096 * tensors).split(4096))
    ops.sparse_unpack_gathered_segments(torch.stack([chunk, chunk]), regions, 2, 1.0, 2, outs=outs)
    return packed - before, launched() - packed


@ON_THE_EMULATION
def test_a_quantized_bucket_launches_the_same_kernels_whatever_its_number_of_tensors(device):
    """One tensor, 4 and ResNet-50's 161 (docs/kernels.md, "Launches"): pack_sampled_fixed's 15
    with the quantized sends, a block a tensor, for its sends, and the segments' one; the unpack's
    three (the buckets' starts, the entries, the sum)."""
    assert [quantized_launches(tensors) for tensors in (1, 4, 161)] == [(16, 3)] * 3


@ON_THE_EMULATION
def test_a_quantized_bucket_reads_nothing_on_the_host(device):
    """pack_quantized_fixed, quantized_segments_fixed_into and sparse_unpack_gathered_segments: no
    read of device data by the binding; sparse_unpack_segments of the same data (each rank's count)
    is the counter's control."""
    reads = torch.ops.sparsecomm_cuda_emulation.host_reads
    before = reads()
    quantized_launches(4)
    between = reads()
    gathered, _, segments = ranks_chunks(2, seed=3, device=device)
    ops.sparse_unpack_segments(torch.cat([s[0] for s in segments]), 2, 3, 70_000, out=torch.empty(70_000))
    assert (between - before, reads() - between) == (0, 3)


def test_the_quantized_bucket_ops_name_a_wrong_argument(device):
    g = torch.randn(10, device=device)
    plan = [1, 0, 1, 1, 0, 0]
    with pytest.raises(RuntimeError, match=r"^pack_quantized_fixed: bits should be 1 or 2, got 3"):
        ops.pack_quantized_fixed([g], [None], [None], 0.0, [None], False, True, [0.1], plan, 0, 3)
    with pytest.raises(RuntimeError, match=r"^pack_quantized_fixed: residuals, momenta, grad_scales and ratios"):
        ops.pack_quantized_fixed([g], [None, None], [None], 0.0, [None], False, True, [0.1], plan, 0, 1)
    codes, scales, index, counts = ops.pack_quantized_fixed(
        [g], [None], [None], 0.0, [None], False, True, [0.1], plan, 0, 2
    )
    chunk = torch.zeros(64, dtype=torch.uint8, device=device)
    write = ops.quantized_segments_fixed_into
    with pytest.raises(RuntimeError, match=r"fixed_into: codes should have 1 bytes for 1 values of 2 bits, got 2"):
        write([torch.zeros(2, dtype=torch.uint8, device=device)], scales, index, counts, 2, [(0, 8, 10)], out=chunk)
    lengths = r"should hold one entry and places three numbers .* got 1 codes, 1 scales, 1 index, 1 counts and 2 places"
    with pytest.raises(RuntimeError, match=lengths):
        write(codes, scales, index, counts, 2, [(0, 8)], out=chunk)
    fits = r"send 0's count slot at 0 and segment of 32 bytes at 40 \(both 8-byte aligned\) should fit out's 64 bytes"
    with pytest.raises(RuntimeError, match=fits + " in that order"):
        write(codes, scales, index, counts, 2, [(0, 40, 10)], out=chunk)
    with pytest.raises(RuntimeError, match=r"send 0's numel should be in \[its room 1, 2\^31\), got 0"):
        write(codes, scales, index, counts, 2, [(0, 8, 0)], out=chunk)
    unpack = ops.sparse_unpack_gathered_segments
    gathered = torch.zeros(2, 48, dtype=torch.uint8, device=device)
    with pytest.raises(
        RuntimeError, match=r"regions should hold 2 numbers \(byte offset, room\) for each of the 1 outs"
    ):
        unpack(gathered, [(8, 1, 0)], 2, outs=[torch.empty(10, device=device)])
    inside = r"out 0's segment of 32 bytes at 24 \(8-byte aligned\) should lie inside a chunk of 48 bytes"
    with pytest.raises(RuntimeError, match=inside):
        unpack(gathered, [(24, 1)], 2, outs=[torch.empty(10, device=device)])
    with pytest.raises(RuntimeError, match=r"out 0's room should be in \[0, 10\], its numel, got 11"):
        unpack(gathered, [(8, 11)], 2, outs=[torch.empty(10, device=device)])


def test_counts_and_indices_the_host_can_read_are_checked():
    """On the CPU binding the counts lie in host memory: a count past its room, indices out of
    order and bucket counts that do not add up are refused (on CUDA they would need a read)."""
    scales, codes = torch.zeros(4), torch.zeros(2, dtype=torch.uint8)
    index = torch.tensor([3, 1, 0, 0, 0, 0, 0], dtype=torch.int32)
    chunk = torch.zeros(64, dtype=torch.uint8)
    with pytest.raises(
        RuntimeError, match=r"quantized_segments_fixed_into: send 0's count should lie in \[0, 7\], its room, got 9"
    ):
        ops.quantized_segments_fixed_into([codes], [scales], [index], torch.tensor([9]), 2, [(0, 8, 10)], out=chunk)
    with pytest.raises(
        RuntimeError,
        match=r"fixed_into: send 0's index should be strictly ascending and below its numel up to its count, 2",
    ):
        ops.quantized_segments_fixed_into([codes], [scales], [index], torch.tensor([2]), 2, [(0, 8, 10)], out=chunk)
    index[:2] = torch.tensor([1, 3], dtype=torch.int32)
    ops.quantized_segments_fixed_into([codes], [scales], [index], torch.tensor([2]), 2, [(0, 8, 10)], out=chunk)
    gathered = torch.stack([chunk, chunk])
    gathered[1, 8:16] = torch.tensor([99]).view(torch.uint8)
    with pytest.raises(RuntimeError, match=r"rank 1 has a count of 99 for out 0, whose segment has room for 7"):
        ops.sparse_unpack_gathered_segments(gathered, [(8, 7)], 2, outs=[torch.empty(10)])
    gathered[1, 8:16] = torch.tensor([1]).view(torch.uint8)
    with pytest.raises(RuntimeError, match=r"rank 1's bucket counts for out 0 do not add up to its count, 1"):
        ops.sparse_unpack_gathered_segments(gathered, [(8, 7)], 2, outs=[torch.empty(10)])
    np.testing.assert_array_equal(chunk[:8].view(torch.int64).numpy(), [2])
