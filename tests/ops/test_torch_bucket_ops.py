"""The bucket-wide unpack (sparse_unpack_gathered_rows): every tensor of a DDP bucket unpacked from
one all_gather in one call, with each rank's row counts read where the op runs. Against the
per-tensor op (sparse_unpack_rows of each rank's rows, cut by its count) bit for bit, and against a
float32 index_add, on the CPU and the emulated CUDA binding."""

import pytest
import torch
from cases import gathered_selections

from sparsecomm.torch import ops

COUNT = 8  # bytes of a row count in a chunk's header
GAP = 3  # elements between two outs in the bucket (another route's gradient): never written
FOREIGN = 1  # the header slot of a tensor another part unpacks (a 1-/2-bit segment): never read


class Bucket:
    """Each rank's chunk as sparsecomm.torch.ddp_parts.Gathered lays it out (one row of `gathered`
    per rank): a header of row counts, one slot per tensor and the foreign slot, then each tensor's
    rows padded to a capacity of whole counts, with random bytes (a marker-like pair among them)."""

    def __init__(self, numels, ranks, value_dtype, seed):
        gen = torch.Generator().manual_seed(seed)
        self.numels, self.sends = numels, []  # per tensor, per rank: (values, index)
        for t, numel in enumerate(numels):
            per_rank = max(1, numel // 50)
            values, index = gathered_selections(numel, per_rank, ranks, value_dtype, seed=seed + t)
            sent = [max(1, per_rank - r) for r in range(ranks)]  # (ranks send different counts, as Threshold's do)
            self.sends.append(
                [(values[r * per_rank :][: sent[r]], index[r * per_rank :][: sent[r]]) for r in range(ranks)]
            )
        rows = [[ops.wire_rows(v, i, 0, numel) for v, i in sends] for numel, sends in zip(numels, self.sends)]
        self.rows = rows
        slots = [s for s in range(len(numels) + 1) if s != FOREIGN]
        offset, self.regions = COUNT * (len(numels) + 1), []
        for slot, per_rank_rows in zip(slots, rows):
            most = max(r.numel() for r in per_rank_rows) + 3 * per_rank_rows[0].shape[1]
            self.regions.append((slot, offset, -(-most // COUNT) * COUNT))
            offset += self.regions[-1][2]
        self.gathered = torch.randint(0, 256, (ranks, offset), dtype=torch.uint8, generator=gen)
        for r in range(ranks):
            self.gathered[r, FOREIGN * COUNT :][:COUNT] = _count_bytes(10**9)
            for (slot, at, capacity), per_rank_rows in zip(self.regions, rows):
                sent = per_rank_rows[r].view(-1)
                self.gathered[r, slot * COUNT :][:COUNT] = _count_bytes(per_rank_rows[r].shape[0])
                self.gathered[r, at:][: sent.numel()] = sent
                if capacity - sent.numel() >= 2:
                    self.gathered[r, at + sent.numel() :][:2] = 0xFF  # padding that looks like a marker

    def outs(self, dtype, device):
        """Views of one flat buffer, GAP elements of 7 between them (and before the first)."""
        flat = torch.full((sum(self.numels) + GAP * (len(self.numels) + 1),), 7.0, dtype=dtype, device=device)
        outs, at = [], GAP
        for numel in self.numels:
            outs.append(flat[at:][:numel].fill_(9.0))  # stale values, to be overwritten
            at += numel + GAP
        return flat, outs


def _count_bytes(count):
    return torch.tensor([count], dtype=torch.int64).view(torch.uint8)


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize(
    "value_dtype,dtype",
    [(torch.float32, torch.float32), (torch.float16, torch.float16), (torch.bfloat16, torch.float32)],
)
def test_a_bucket_unpacks_as_its_tensors_one_by_one(device, ranks, value_dtype, dtype):
    """Tensors of 1 element, a few, and 140,000 (three wire buckets), each rank's rows cut by its
    count: the same bits as sparse_unpack_rows tensor by tensor, the float32 sums scaled by 1/3,
    and the elements between the outs untouched."""
    bucket = Bucket([1, 40, 140_000, 3_000], ranks, value_dtype, seed=ranks)
    flat, outs = bucket.outs(dtype, device)
    scale = torch.tensor([1.0], device=device)
    ops.sparse_unpack_gathered_rows(bucket.gathered.to(device), bucket.regions, value_dtype, scale, 3, outs=outs)
    for out, numel, rows, sends in zip(outs, bucket.numels, bucket.rows, bucket.sends):
        one_by_one = torch.empty(numel, dtype=dtype, device=device)
        ops.sparse_unpack_rows(torch.cat(rows).to(device), value_dtype, numel, scale, 3, out=one_by_one)
        assert torch.equal(out.view(torch.uint8), one_by_one.view(torch.uint8))
        values, index = torch.cat([v for v, _ in sends]), torch.cat([i for _, i in sends])
        want = torch.zeros(numel).index_add_(0, index.long(), values.float()) * float(torch.tensor(1 / 3))
        assert torch.equal(out.cpu(), want.to(dtype))
    assert torch.equal(flat.cpu()[_gap_mask(flat, outs)], torch.full((GAP * (len(outs) + 1),), 7.0, dtype=dtype))


def _gap_mask(flat, outs):
    """The elements of `flat` no out covers."""
    mask = torch.ones(flat.numel(), dtype=torch.bool)
    size = flat.element_size()
    for out in outs:
        mask[(out.data_ptr() - flat.data_ptr()) // size :][: out.numel()] = False
    return mask


def test_a_subset_of_the_tensors_reads_only_their_slots(device):
    """Outs given for the second and fourth tensor only (the others another dtype's call): only their
    regions are read, whatever lies in the other slots."""
    bucket = Bucket([500, 70_000, 20, 900], 2, torch.float32, seed=11)
    _, outs = bucket.outs(torch.float32, device)
    chosen = [1, 3]
    ops.sparse_unpack_gathered_rows(
        bucket.gathered.to(device),
        [bucket.regions[i] for i in chosen],
        torch.float32,
        1.0,
        2,
        outs=[outs[i] for i in chosen],
    )
    for i in chosen:
        want = torch.empty(bucket.numels[i], device=device)
        ops.sparse_unpack_rows(torch.cat(bucket.rows[i]).to(device), torch.float32, bucket.numels[i], 1.0, 2, out=want)
        assert torch.equal(outs[i], want)
    assert torch.equal(outs[0], torch.full_like(outs[0], 9.0)) and torch.equal(outs[2], torch.full_like(outs[2], 9.0))


def test_no_outs_is_nothing_to_do(device):
    ops.sparse_unpack_gathered_rows(torch.empty(2, 0, dtype=torch.uint8, device=device), [], torch.float32, outs=[])


def test_bad_regions_and_counts_are_named():
    bucket = Bucket([100, 200], 2, torch.float32, seed=5)
    _, outs = bucket.outs(torch.float32, "cpu")
    unpack = ops.sparse_unpack_gathered_rows
    with pytest.raises(
        RuntimeError,
        match=r"regions should hold 3 numbers \(count slot, byte offset, bytes\) for each of the 2 outs, got 3",
    ):
        ops._ops.sparse_unpack_gathered_rows_into(bucket.gathered, [0, 24, 8], torch.float32, torch.ones(1), 1, outs)
    with pytest.raises(RuntimeError, match=r"region 1 \(count slot 2, bytes \[8, 16\)\) should come after its count"):
        unpack(bucket.gathered, [bucket.regions[0], (2, 8, 8)], torch.float32, outs=outs)
    with pytest.raises(RuntimeError, match=r"should come after its count and lie inside a chunk of"):
        unpack(bucket.gathered, [bucket.regions[0], (2, 24, 10**6)], torch.float32, outs=outs)
    with pytest.raises(RuntimeError, match=r"gathered should be a 2-D uint8 tensor"):
        unpack(bucket.gathered.view(-1), bucket.regions, torch.float32, outs=outs)
    with pytest.raises(
        RuntimeError, match=r"outs should be contiguous, of one dtype and on gathered's device; out 1 is Half"
    ):
        unpack(bucket.gathered, bucket.regions, torch.float32, outs=[outs[0], outs[1].half()])
    small = [(slot, at, 8) for slot, at, _ in bucket.regions]
    with pytest.raises(RuntimeError, match=r"rank 0 has \d+ rows of 6 bytes for out 0, whose region has 8 bytes"):
        unpack(bucket.gathered, small, torch.float32, outs=outs)


@pytest.mark.usefixtures("cuda_emulated_ops")
def test_on_cuda_the_outs_must_share_an_allocation(monkeypatch, cuda_emulated_ops):
    """The CUDA policy writes every out through the lowest one's pointer."""
    monkeypatch.setattr(ops, "_ops", cuda_emulated_ops)
    bucket = Bucket([100, 200], 2, torch.float32, seed=5)
    apart = [torch.empty(100), torch.empty(200)]
    with pytest.raises(RuntimeError, match=r"on CUDA, outs should be views of one allocation"):
        ops.sparse_unpack_gathered_rows(bucket.gathered, bucket.regions, torch.float32, outs=apart)


@pytest.mark.usefixtures("host_binding")
def test_the_bucket_unpack_passes_opcheck():
    """(One out: opcheck copies each input apart, which CUDA's shared allocation would refuse.)"""
    bucket = Bucket([100, 200], 2, torch.float32, seed=5)
    args = (bucket.gathered, list(bucket.regions[1]), torch.float32, torch.ones(1), 2, [torch.empty(200)])
    torch.library.opcheck(ops._ops.sparse_unpack_gathered_rows_into.default, args)
