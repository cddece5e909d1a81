"""The TF selection ops against the torch ops: same kernels, so the same inputs must give the
same bits (values, indices, residual, momentum), eager and inside tf.function. The torch ops
are themselves checked against plain references in test_torch_select_ops.py."""

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
from placements import layouts  # noqa: E402

from sparsecomm.core import packing, placement  # noqa: E402
from sparsecomm.tensorflow import ops as tf_ops  # noqa: E402
from sparsecomm.torch import ops as torch_ops  # noqa: E402

DTYPES = [(torch.float32, tf.float32), (torch.float16, tf.float16), (torch.bfloat16, tf.bfloat16)]
KW = dict(seed=3, tensor_id=11, step=4)


def _inputs(numel, torch_dtype, kind="normal", momentum=False):
    gen = torch.Generator().manual_seed(numel)
    if kind == "normal":
        grad = torch.randn(numel, generator=gen)
    elif kind == "ties":
        grad = torch.randint(-2, 3, (numel,), generator=gen).float()
    else:  # a few huge values a strided sample misses
        grad = torch.zeros(numel)
        grad[[3, numel // 2 + 1, numel - 1]] = torch.tensor([7.0, -8.0, 9.0])
    grad = grad.to(torch_dtype)
    residual = torch.randn(numel, generator=gen) * 0.3
    mom = torch.randn(numel, generator=gen) * 0.3 if momentum else None
    return grad, residual, mom


def _tf(t, dtype=None):
    if t is None:
        return None
    return tf.cast(tf.constant(t.float().numpy()), dtype or tf.float32)


def _same(tf_t, torch_t):
    if torch_t is None:
        assert tf_t is None
        return
    got = tf.cast(tf_t, tf.float32).numpy() if tf_t.dtype in (tf.float16, tf.bfloat16) else tf_t.numpy()
    want = torch_t.float().numpy() if torch_t.is_floating_point() else torch_t.numpy()
    np.testing.assert_array_equal(
        got.view(np.int32) if got.dtype == np.float32 else got,
        want.view(np.int32) if want.dtype == np.float32 else want,
    )


CASES = {
    "pack_above": (lambda o, g, r, m, mf: o.pack_above(g, r, 1.0, momentum=m, momentum_factor=mf)),
    "pack_topk": (lambda o, g, r, m, mf: o.pack_topk(g, r, 37, momentum=m, momentum_factor=mf, **KW)),
    "pack_sampled": (lambda o, g, r, m, mf: o.pack_sampled(g, r, 0.01, momentum=m, momentum_factor=mf, **KW)),
    "pack_randomk": (lambda o, g, r, m, mf: o.pack_randomk(g, r, 50, momentum=m, momentum_factor=mf, **KW)),
    "pack_rtopk": (lambda o, g, r, m, mf: o.pack_rtopk(g, r, 100, 20, momentum=m, momentum_factor=mf, **KW)),
}


@pytest.mark.parametrize("torch_dtype,tf_dtype", DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", ["normal", "ties", "hidden"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_tf_pack_equals_torch_pack(torch_dtype, tf_dtype, case, kind, graph):
    momentum = case == "pack_sampled"  # DGC-style momentum correction on one of them
    mf = 0.9 if momentum else 0.0
    grad, residual, mom = _inputs(5003, torch_dtype, kind, momentum)
    grad_tf, residual_tf, mom_tf = _tf(grad, tf_dtype), _tf(residual), _tf(mom)
    fn = CASES[case]

    def pack(g, r, m):
        return fn(tf_ops, g, r, m, mf)

    run = tf.function(pack) if graph else pack
    values, index, residual_out, mom_out = (
        run(grad_tf, residual_tf, mom_tf) if momentum else run(grad_tf, residual_tf, None)
    )
    t_mom = mom.clone() if momentum else None
    t_res = residual.clone()
    want = fn(torch_ops, grad, t_res, t_mom, mf)
    want_values, want_index = want if isinstance(want, tuple) else (want, None)
    assert values.dtype == tf_dtype
    _same(values, want_values)
    _same(index, want_index)
    _same(residual_out, t_res)
    if momentum:
        _same(mom_out, t_mom)


@pytest.mark.parametrize("torch_dtype,tf_dtype", DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_tf_dense_state_passes_equal_torch(torch_dtype, tf_dtype, graph):
    """accumulate (random-k's pass; here with both states) and momentum_step (DGC's dense route,
    a 2-D gradient: the payload keeps its shape and dtype, the momentum stays flat)."""
    grad, residual, mom = _inputs(5003 * 2, torch_dtype, momentum=True)
    grad[:2] = torch.tensor([float("inf"), -float("inf")])  # (NaN: its payload bits differ once through _tf)
    wrap = tf.function if graph else (lambda f: f)
    res_out, mom_out = wrap(lambda g, r, m: tf_ops.accumulate(g, r, momentum=m, momentum_factor=0.9))(
        _tf(grad, tf_dtype), _tf(residual), _tf(mom)
    )
    t_res, t_mom = residual.clone(), mom.clone()
    torch_ops.accumulate(grad, t_res, momentum=t_mom, momentum_factor=0.9)
    _same(res_out, t_res)
    _same(mom_out, t_mom)
    assert tf_ops.accumulate(_tf(grad, tf_dtype), None, momentum=_tf(mom), momentum_factor=0.9)[0] is None

    payload, mom_out = wrap(lambda g, m: tf_ops.momentum_step(g, m, 0.9))(
        tf.reshape(_tf(grad, tf_dtype), [2, 5003]), _tf(mom)
    )
    t_grad, t_mom = grad.clone(), mom.clone()
    torch_ops.momentum_step(t_grad, t_mom, 0.9)
    assert payload.dtype == tf_dtype and payload.shape == (2, 5003) and mom_out.shape == (10_006,)
    _same(tf.reshape(payload, [-1]), t_grad)
    _same(mom_out, t_mom)


@pytest.mark.parametrize("bits", [1, 2])
def test_tf_quantize_and_unpack_equal_torch(bits):
    gen = torch.Generator().manual_seed(0)
    acc = torch.randn(333, generator=gen)
    index = torch.randperm(1000, generator=gen)[:333].sort().values.int()
    residual = torch.zeros(1000)
    codes, scales = torch_ops.send_quantized(acc, index, residual, bits)
    tf_codes, tf_scales, tf_res, _ = tf_ops.send_quantized(_tf(acc), tf.constant(index.numpy()), tf.zeros(1000), bits)
    _same(tf_codes, codes)
    _same(tf_scales, scales)
    _same(tf_res, residual)
    _same(tf_ops.dequantize(tf_codes, tf_scales, 333, bits), torch_ops.dequantize(codes, scales, 333, bits))
    dup = torch.cat([index, index[:50]])
    vals = torch.randn(dup.numel(), generator=gen)
    _same(
        tf_ops.sparse_unpack(_tf(vals), tf.constant(dup.numpy()), 1000, 0.5),
        torch_ops.sparse_unpack(vals, dup, 1000, 0.5),
    )


@pytest.mark.parametrize("torch_dtype,tf_dtype", DTYPES)
@pytest.mark.parametrize("ranks,numerator", [(1, 1.0), (3, 1.0), (3, 3.0), (4, 0.37)])
def test_tf_unpack_scaled_by_a_tensor_equals_torch_rows(torch_dtype, tf_dtype, ranks, numerator):
    """decompress's one op: every rank's values added at their indices (duplicates in rank order),
    times Horovod's reduced placeholder over the ranks, rounded once to the gradient's dtype: the
    bits of the torch unpack of the same rows with the same scale tensor and divisor."""
    gen = torch.Generator().manual_seed(ranks)
    numel = 5_000
    index = torch.cat([torch.randperm(numel, generator=gen)[:700].sort().values.int() for _ in range(ranks)])
    values = (torch.randn(index.numel(), generator=gen) * 100).to(torch_dtype)
    values[:3] = torch.tensor([float("nan"), float("inf"), -0.0])
    sends = [
        torch_ops.wire_rows(values[r * 700 : (r + 1) * 700], index[r * 700 : (r + 1) * 700], 0, numel)
        for r in range(ranks)
    ]
    expected = torch_ops.sparse_unpack_rows(
        torch.cat(sends),
        torch_dtype,
        numel,
        torch.tensor([numerator]),
        ranks,
        out=torch.empty(numel, dtype=torch_dtype),
    )
    unpack = lambda v, i, s: tf_ops.sparse_unpack(v, i, numel, s, divisor=ranks)  # noqa: E731
    same_bits = values.view(torch.int16 if values.element_size() == 2 else torch.int32).numpy()  # NaN's too
    args = (tf.bitcast(tf.constant(same_bits), tf_dtype), tf.constant(index.numpy()), tf.constant([numerator]))
    for run in (unpack, tf.function(unpack)):
        _same(run(*args), expected)


@pytest.mark.parametrize("torch_dtype,tf_dtype", DTYPES)
def test_tf_wire_rows_are_torch_bytes_and_read_back_alike(torch_dtype, tf_dtype):
    """The TF exchange builds and reads sparsecomm.core.wire's rows with its ops: byte for byte
    torch's (tests/ops/test_torch_wire_ops.py checks those against numpy), for a whole tensor and
    SparDL blocks of three buckets, read back concatenated as an alltoall brings them."""
    from sparsecomm.tensorflow import exchange

    gen = torch.Generator().manual_seed(5)
    numel, sends, tf_sends = 200_000, [], []
    for start, length in [(0, numel), (0, 70_000), (70_000, 130_000), (130_000, 0)]:
        index = (torch.randperm(length, generator=gen)[: length // 100].sort().values + start).int()
        values = (torch.randn(index.numel(), generator=gen) * 100).to(torch_dtype)
        same_bits = values.view(torch.int16 if values.element_size() == 2 else torch.int32).numpy()
        tf_values = tf.bitcast(tf.constant(same_bits), tf_dtype)
        sends.append(torch_ops.wire_rows(values, index, start, length))
        for build in (exchange._rows, tf.function(exchange._rows)):
            rows = build(tf_values, tf.constant(index.numpy()), start, length)
            np.testing.assert_array_equal(rows.numpy(), sends[-1].numpy())
        tf_sends.append(rows)
    values, index = exchange._from_rows(tf.concat(tf_sends, 0), tf_dtype)
    want_values, want_index = torch_ops.wire_columns(torch.cat(sends), torch_dtype)
    _same(index, want_index)
    _same(values, want_values)


@pytest.mark.parametrize("torch_dtype,tf_dtype", DTYPES)
def test_tf_rounding_to_the_value_dtype_is_torch_bits_nans_included(torch_dtype, tf_dtype):
    """The owner's rounding of float32 sums (SparDL, hierarchical) and the shared-coordinate
    unpack's cast: the same bits in both frameworks; a NaN, whatever its sign and payload, is the
    dtype's quiet NaN with its sign, as the kernels write it (tests/ops/test_torch_block_ops.py)."""
    from sparsecomm.tensorflow import exchange as tf_exchange
    from sparsecomm.torch import exchange as torch_exchange

    patterns = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC12345, 0xFFA00001, 0x7F800000, 0xFF800000, 0x3F808000]
    bits = np.array(patterns + [0x477FF000, 0x00000001, 0x80000000], dtype=np.uint32)
    values = torch.from_numpy(bits.view(np.float32).copy())
    want = torch_exchange.to_value_dtype(values, torch_dtype)
    got = tf_exchange.to_value_dtype(tf.constant(values.numpy()), tf_dtype)
    np.testing.assert_array_equal(
        tf.bitcast(got, tf.uint16 if tf_dtype.size == 2 else tf.uint32).numpy(),
        want.view(torch.int16 if want.element_size() == 2 else torch.int32)
        .numpy()
        .view(np.uint16 if want.element_size() == 2 else np.uint32),
    )
    if torch_dtype != torch.float32:
        quiet = 0x7FC0 if torch_dtype == torch.bfloat16 else 0x7E00
        nan_bits = want[:5].view(torch.int16).numpy().view(np.uint16)
        assert list(nan_bits) == [quiet, quiet | 0x8000, quiet, quiet, quiet | 0x8000], [hex(b) for b in nan_bits]


@pytest.mark.parametrize("bits", [1, 2])
def test_tf_quantized_segments_are_torch_bytes_and_read_back_alike(bits):
    """The TF exchange's 1-/2-bit segments (count, scales, bucket counts, offsets, codes): byte for
    byte torch's, and the indices and values read back from three ranks' gathered segments."""
    from types import SimpleNamespace

    from sparsecomm.tensorflow import exchange

    gen, numel = torch.Generator().manual_seed(bits), 200_000
    torch_segments, tf_segments = [], []
    for count in (3000, 0, 1200):  # each rank's own scales: the third's decode must not take the first's
        index = torch.randperm(numel, generator=gen)[:count].sort().values.int()
        codes = torch.randint(0, 256, ((count * bits + 7) // 8,), generator=gen, dtype=torch.uint8)
        scales = torch.randn(2 if bits == 1 else 4, generator=gen)
        torch_segments.append(torch_ops.quantized_segment(codes, scales, index, bits, numel))
        packed = SimpleNamespace(
            index=tf.constant(index.numpy()),
            codes=tf.constant(codes.numpy()),
            scales=tf.constant(scales.numpy()),
            bits=bits,
        )
        tf_segments.append(exchange._segment(packed, numel))
        np.testing.assert_array_equal(tf_segments[-1].numpy(), torch_segments[-1].numpy())
    values, index = exchange._from_segments(tf.concat(tf_segments, 0), bits, 3, numel)
    want = torch.zeros(numel)
    torch_ops.sparse_unpack_segments(torch.cat(torch_segments), bits, 3, numel, out=want)
    got = tf.tensor_scatter_nd_add(tf.zeros([numel]), tf.expand_dims(index, 1), values)  # overlaps add, as torch's
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def _segment_of(count, bits, numel, seed):
    """(codes, scales, index) of `count` random sends of a tensor of `numel`, as TF tensors."""
    gen = torch.Generator().manual_seed(seed)
    index = torch.randperm(numel, generator=gen)[:count].sort().values.int()
    codes = torch.randint(0, 256, ((count * bits + 7) // 8,), generator=gen, dtype=torch.uint8)
    return (
        tf.constant(codes.numpy()),
        tf.constant(torch.randn(2 if bits == 1 else 4).numpy()),
        tf.constant(index.numpy()),
    )


def test_tf_segments_are_read_back_in_one_op_whatever_the_number_of_ranks():
    """The gathered segments of 2 ranks or 7 trace to the same graph: the decode does not grow
    with the job (it took about 15 graph ops a rank)."""
    numel = 1000

    def ops_of(ranks):
        segments = tf.concat(
            [tf_ops.quantized_segment(*_segment_of(5, 2, numel, r), 2, numel) for r in range(ranks)], 0
        )
        graph = tf.function(lambda g: tf_ops.segment_columns(g, 2, ranks, numel)).get_concrete_function(segments).graph
        return sorted(op.type for op in graph.get_operations())

    assert ops_of(2) == ops_of(7) == ["Identity", "Identity", "Placeholder", "SparsecommSegmentColumns"]


def test_tf_segments_refuse_what_does_not_fit():
    codes, scales, index = _segment_of(40, 1, 70_000, 0)
    segment = tf_ops.quantized_segment(codes, scales, index, 1, 70_000).numpy()
    read = lambda data, ranks=1: tf_ops.segment_columns(tf.constant(data), 1, ranks, 70_000)  # noqa: E731
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"2 segments should fill gathered \(232 bytes\), got 224"):
        read(np.concatenate([segment, segment, np.zeros(8, np.uint8)]), ranks=2)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"segment 1 of 2 at byte 112 of 120 has no count that fits \(40\)"
    ):
        read(np.concatenate([segment, segment[:8]]), ranks=2)  # a second count, and no room for its segment
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"segment 1 of 2 at byte 112 of 112 has no count that fits"
    ):
        read(segment, ranks=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="segment 0 of 1 at byte 0 of 4 has no count that fits"):
        read(segment[:4])
    broken = segment.copy()
    broken[16] += 1  # the first bucket's count (after the count and 2 scales): 41 of 40
    with pytest.raises(tf.errors.InvalidArgumentError, match="segment 0's bucket counts do not add up to its count 40"):
        read(broken)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"index should be strictly ascending in \[0, 70000\)"):
        tf_ops.quantized_segment(codes, scales, tf.reverse(index, [0]), 1, 70_000)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="codes should have 5 bytes for 40 values of 1 bits, got 4"
    ):
        tf_ops.quantized_segment(codes[:4], scales, index, 1, 70_000)
    with pytest.raises(tf.errors.InvalidArgumentError, match="scales should be 2 values, got 4"):
        tf_ops.quantized_segment(codes, tf.zeros([4]), index, 1, 70_000)


def test_tf_random_k_and_threshold_equal_torch():
    _same(tf_ops.random_k_indices(10_007, 99, **KW), torch_ops.random_k_indices(torch.empty(10_007), 99, **KW))
    grad, residual, _ = _inputs(100_000, torch.float32)
    _same(
        tf_ops.sample_threshold(_tf(grad), _tf(residual), 0.01, **KW),
        torch_ops.sample_threshold(grad, residual, 0.01, **KW),
    )


@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.7])
def test_tf_threshold_rank_uses_the_double_ratio(ratio):
    """rank = ceil(ratio * count): 0.1 * 320 is 32 in double but 32.0000005 from a float32 0.1,
    which made the TF op pick the 33rd value (a float32 attr did; the ratio is a double input now)."""
    grad, residual, _ = _inputs(320, torch.float32)
    for step in range(4):
        kw = dict(KW, step=step)
        _same(
            tf_ops.sample_threshold(_tf(grad), _tf(residual), ratio, **kw),
            torch_ops.sample_threshold(grad, residual, ratio, **kw),
        )
        _same(
            tf_ops.pack_sampled(_tf(grad), _tf(residual), ratio, **kw)[1],
            torch_ops.pack_sampled(grad, residual.clone(), ratio, **kw)[1],
        )


@pytest.mark.parametrize("count,kept", [(0, "every"), (3, "every"), (4, "all"), (6, "all"), (7, "top"), (12, "top")])
@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_the_band_keeps_its_bounds_exactly_in_both_kernel_sets(framework, count, kept):
    """The sampled pack's band of 4 to 6 candidates for k = 5, at and beyond its bounds: below it
    the top 5 of every element (of the tensor that holds acc, NaN as +inf), within it (bounds
    included) every candidate, above it the top 5 of the candidates (ties: lower index), in index
    order; against numpy, in a graph for TF."""
    acc = np.array([0.5, -3.0, 2.0, 2.0, -1.0, 4.0, 0.25, -2.0, 1.0, 3.0, -0.5, 2.0][:count], np.float32)
    index = np.arange(0, 2 * count, 2, dtype=np.int32)
    every = np.array([0.1, -0.7, np.nan, 0.3, -0.7, 0.9, 0.2, -0.4, 0.6], np.float32)
    top = lambda x: sorted(sorted(range(len(x)), key=lambda i: (-np.nan_to_num(abs(x[i]), nan=np.inf), i))[:5])  # noqa: E731
    want = {"every": (every[top(every)], top(every)), "all": (acc, index), "top": (acc[top(acc)], index[top(acc)])}
    plan = packing.Plan(ratio=0.5, sample_count=1, k=5, too_few=4, too_many=6)
    if framework == "torch":
        got = packing._within_band(torch_ops.KERNELS, plan, *map(torch.from_numpy, (acc, index, every)))
    else:
        within = tf.function(lambda *xs: packing._within_band(tf_ops.KERNELS, plan, *xs))
        got = within(*map(tf.constant, (acc, index, every.reshape(3, 3))))
    np.testing.assert_array_equal(np.asarray(got[0]), want[kept][0])
    np.testing.assert_array_equal(np.asarray(got[1]), want[kept][1])


def _assert_dgc_ops_same(torch_dtype, tf_dtype, graph, scale_momentum_step, **momentum):
    """DGC's ops on the same inputs, TF (eager or in a tf.function) against torch, bit for bit: the
    sampled pack with a momentum (`momentum`: its settings) and a clipping factor (grad_scale 0.37),
    then momentum_step at 0.9 (with nesterov as given; with the factor if scale_momentum_step)."""
    grad, residual, mom = _inputs(5003, torch_dtype, momentum=True)
    wrap = tf.function if graph else (lambda f: f)
    values, index, res_out, mom_out = wrap(
        lambda g, r, m, s: tf_ops.pack_sampled(g, r, 0.01, momentum=m, grad_scale=s, **momentum, **KW)
    )(_tf(grad, tf_dtype), _tf(residual), _tf(mom), tf.constant(0.37))
    t_res, t_mom = residual.clone(), mom.clone()
    want_values, want_index = torch_ops.pack_sampled(
        grad, t_res, 0.01, momentum=t_mom, grad_scale=torch.tensor(0.37), **momentum, **KW
    )
    for got, want in ((values, want_values), (index, want_index), (res_out, t_res), (mom_out, t_mom)):
        _same(got, want)
    step = dict(nesterov=momentum.get("nesterov", False))
    payload, mom_out = wrap(lambda g, m, s: tf_ops.momentum_step(g, m, 0.9, grad_scale=s, **step))(
        _tf(grad, tf_dtype), _tf(mom), tf.constant(0.37) if scale_momentum_step else None
    )
    t_grad, t_mom = grad.clone(), mom.clone()
    torch_ops.momentum_step(t_grad, t_mom, 0.9, grad_scale=torch.tensor(0.37) if scale_momentum_step else None, **step)
    _same(payload, t_grad)
    _same(mom_out, t_mom)


@pytest.mark.parametrize("torch_dtype,tf_dtype", DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_tf_grad_scale_equals_torch(torch_dtype, tf_dtype, graph):
    """DGC's clipping factor as grad_scale: the sampled pack (sample_threshold and
    accumulate_candidates) and momentum_step give the torch ops' bits."""
    _assert_dgc_ops_same(torch_dtype, tf_dtype, graph, scale_momentum_step=True, momentum_factor=0.9)


@pytest.mark.parametrize("torch_dtype,tf_dtype", DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_tf_nesterov_equals_torch(torch_dtype, tf_dtype, graph):
    """DGC's Nesterov momentum, with a clipping factor: the sampled pack and momentum_step give
    the torch ops' bits."""
    _assert_dgc_ops_same(torch_dtype, tf_dtype, graph, scale_momentum_step=False, momentum_factor=0.9, nesterov=True)


@pytest.mark.parametrize("torch_dtype,tf_dtype", DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_tf_sum_of_squares_equals_torch(torch_dtype, tf_dtype, graph):
    """DGC's clipping norm, squared: a float64 scalar with the torch op's bits, for any shape."""
    wrap = tf.function if graph else (lambda f: f)
    for shape in ((0,), (4097,), (3, 70001)):
        grad = (torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))) * 5).to(torch_dtype)
        got = wrap(tf_ops.sum_of_squares)(_tf(grad, tf_dtype))
        assert got.dtype == tf.float64 and got.shape == ()
        assert float(got.numpy()) == torch_ops.sum_of_squares(grad).item(), shape


def test_tf_errors_are_named():
    with pytest.raises(tf.errors.InvalidArgumentError, match="residual should have 10 elements"):
        tf_ops.pack_above(tf.zeros(10), tf.zeros(9), 1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="momentum should have 10 elements like grad, got 9"):
        tf_ops.momentum_step(tf.zeros(10), tf.zeros(9), 0.9)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"momentum should have 10 elements \(or 0: absent\)"):
        tf_ops.accumulate(tf.zeros(10), None, momentum=tf.zeros(9))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"grad_scale needs a residual or a momentum, got neither"):
        tf_ops.accumulate_candidates(tf.zeros(10), None, 1.0, grad_scale=tf.constant(0.5))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"grad_scale should have 1 element \(or 0: none\), got 2"):
        tf_ops.momentum_step(tf.zeros(10), tf.zeros(10), 0.9, grad_scale=tf.ones(2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"index should be in \[0, 5\)"):
        tf_ops.sparse_unpack(tf.ones(1), tf.constant([5], tf.int32), 5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="scale should have 1 element, got 2"):
        tf_ops.sparse_unpack(tf.ones(1), tf.constant([0], tf.int32), 5, tf.ones(2))
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="divisor"):
        tf_ops.sparse_unpack(tf.ones(1), tf.constant([0], tf.int32), 5, divisor=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bits should be 1 or 2, got 3"):
        tf_ops.send_quantized(tf.ones(1), tf.constant([0], tf.int32), None, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dequantize: codes should have 3 bytes for 20 values"):
        tf_ops.dequantize(tf.zeros([4], tf.uint8), tf.zeros([2]), 20, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dequantize: scales should be 2 values, got 4"):
        tf_ops.dequantize(tf.zeros([3], tf.uint8), tf.zeros([4]), 20, 1)
    with pytest.raises(ValueError, match="shape should be static"):
        tf.function(lambda g: tf_ops.pack_topk(g, None, 1)).get_concrete_function(tf.TensorSpec([None], tf.float32))


def test_tf_checked_scale_keeps_core_placements_rule():
    """SparsecommCheckedScale, written in C++ for the graph, refuses exactly the reduced markers
    that core.placement.agrees refuses (every pair of partitions of up to 4 ranks, three op
    scalings), with placement's message; otherwise its output is the first element."""
    for optimizer_set, compressor_set_of, reductions in layouts(4):
        for said in reductions:
            for rank in optimizer_set:
                ranks = compressor_set_of[rank]
                agrees = placement.agrees(*said, ranks)
                try:
                    scale = tf_ops.checked_scale(tf.constant(said), len(ranks), min(ranks), "TopK: refused")
                    assert agrees and scale.numpy().tolist() == said[:1], (said, ranks)
                except tf.errors.InvalidArgumentError as error:
                    assert not agrees and "} TopK: refused; reduced marker [" in error.message, (said, ranks)
    with pytest.raises(tf.errors.InvalidArgumentError, match="reduced should have 3 elements, got 1"):
        tf_ops.checked_scale(tf.constant([1.0]), 2, 0, "TopK: refused")
