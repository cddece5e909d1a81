"""The torch compressors in one process: the compress/decompress contract Horovod relies on
(for the allreduce-ready ones), error feedback conservation, binding, and bad input.
Multi-rank behaviour, including the allgather-based ones, is in test_multirank_torch.py."""

import pytest
import reference
import torch
from common import EVERY

from sparsecomm.torch import DGC, RandomBlock, RandomK, RTopK, Threshold, TopK, calibration
from sparsecomm.torch.exchange import EXCHANGES


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(13, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))


def _backward(model, seed):
    g = torch.Generator().manual_seed(seed)
    model(torch.randn(5, 13, generator=g)).square().sum().backward()


def _gradients(model, steps, set_to_none=True):
    """(step, name, parameter) for each parameter at each step, after a fresh backward pass seeded by the step."""
    for step in range(steps):
        model.zero_grad(set_to_none=set_to_none)
        _backward(model, step)
        for name, p in model.named_parameters():
            yield step, name, p


def test_round_trip_is_the_reference_block_with_error_feedback():
    model = _model()
    comp = RandomBlock(ratio=0.25, seed=11, named_parameters=model.named_parameters(), **EVERY)
    residuals = {n: torch.zeros(p.numel()) for n, p in model.named_parameters()}
    for step, name, p in _gradients(model, 4):
        n = p.numel()
        start = reference.block_start(11, reference.tensor_id(name), step, n)
        want_values, residuals[name] = reference.random_block_pack(
            p.grad, residuals[name], start, reference.count(0.25, n)
        )
        values, ctx = comp.compress(p.grad)
        assert torch.equal(values, want_values)
        dense = comp.decompress(values, ctx)
        assert dense.shape == p.shape and dense.dtype == p.dtype
        assert torch.equal(dense.reshape(-1), reference.random_block_unpack(want_values, n, start))


@pytest.mark.parametrize("set_to_none", [True, False])
def test_error_feedback_conserves_the_gradient(set_to_none):
    """Over T steps: sum of what was sent + final residual == sum of gradients (float32 rounding)."""
    model = _model()
    comp = RandomBlock(ratio=0.1, seed=3, named_parameters=model.named_parameters(), **EVERY)
    sent = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in model.named_parameters()}
    total = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in model.named_parameters()}
    for _, name, p in _gradients(model, 20, set_to_none):
        total[name] += p.grad.double()
        values, ctx = comp.compress(p.grad)
        sent[name] += comp.decompress(values, ctx).double()
    for name, p in model.named_parameters():
        residual = comp.state.parameters[name].residual.reshape(p.shape).double()
        torch.testing.assert_close(sent[name] + residual, total[name], rtol=0, atol=1e-5)
        assert comp.state.parameters[name].step == 20


def test_ratio_one_sends_everything_and_keeps_nothing():
    model = _model()
    comp = RandomBlock(ratio=1.0, seed=5, named_parameters=model.named_parameters(), **EVERY)
    _backward(model, 0)
    for name, p in model.named_parameters():
        grad = p.grad.clone()  # decompress writes the result into the gradient buffer
        values, ctx = comp.compress(p.grad)
        assert values.numel() == p.numel()
        assert torch.equal(comp.decompress(values, ctx), grad)
        assert not comp.state.parameters[name].residual.any()


def test_a_strided_gradient_gets_its_result_in_a_new_contiguous_buffer():
    p = torch.nn.Parameter(torch.zeros(30, 20))
    comp = RandomBlock(ratio=1.0, seed=2, named_parameters=[("w", p)], **EVERY)
    p.grad = torch.randn(20, 30).t()  # the transpose of a contiguous tensor: strided
    grad = p.grad.clone()
    values, ctx = comp.compress(p.grad)
    result = comp.decompress(values, ctx)
    assert torch.equal(result, grad) and result.is_contiguous()
    assert torch.equal(p.grad, grad)  # the strided gradient is left as it was


def test_half_precision_gradients_keep_rounding_error_in_the_residual():
    p = torch.nn.Parameter(torch.zeros(1000, dtype=torch.float16))
    comp = RandomBlock(ratio=0.3, seed=1, named_parameters=[("w", p)], **EVERY)
    grad = (torch.randn(1000) * 1e-3).half()
    p.grad = grad.clone()
    values, ctx = comp.compress(p.grad)
    assert values.dtype == torch.float16
    total = comp.decompress(values, ctx).float() + comp.state.parameters["w"].residual
    assert torch.equal(total, grad.float())


@pytest.mark.parametrize(
    "make",
    [
        lambda named: TopK(ratio=0.01, named_parameters=named),
        lambda named: DGC(ratio=0.001, named_parameters=named),
        lambda named: Threshold(ratio=0.01, quantize="2bit", named_parameters=named),
    ],
)
def test_timing_the_sparse_path_for_auto_never_touches_the_global_rng(make):
    """exchange="auto" times the compressor's own pack + unpack on random gradients (its
    LocalCost): those come from a generator of its own, not from the user's RNG stream."""
    comp = make([("w", torch.nn.Parameter(torch.zeros(10)))])
    torch.manual_seed(3)
    before = torch.get_rng_state()
    small, large, unpack, memset, pairs = calibration.time_sparse_path(comp, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), before)
    assert 0 < small and 0 < large and 0 <= memset and pairs > 0


def test_selection_never_touches_the_global_rng():
    model = _model()
    comp = RandomBlock(ratio=0.5, seed=1, named_parameters=model.named_parameters(), **EVERY)
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    _backward(model, 0)
    for _, p in model.named_parameters():
        comp.decompress(*comp.compress(p.grad))
    assert torch.equal(torch.get_rng_state(), before)


def test_stats_count_bytes():
    model = _model()
    comp = RandomBlock(ratio=0.1, seed=1, named_parameters=model.named_parameters(), **EVERY)
    _backward(model, 0)
    for _, p in model.named_parameters():
        comp.compress(p.grad)
    stats = comp.stats()
    numels = [p.numel() for p in model.parameters()]
    assert stats["calls"] == len(numels)
    assert stats["dense_bytes"] == 4 * sum(numels)
    assert stats["sent_bytes"] == 4 * sum(reference.count(0.1, n) for n in numels)
    for name, p in model.named_parameters():
        per = stats["tensors"][name]
        k = reference.count(0.1, p.numel())
        assert per["calls"] == 1 and per["numel"] == p.numel() and per["sent_elements"] == k
        assert per["sent_bytes"] == 4 * k and per["density"] == k / p.numel()
    assert sum(t["compress_seconds"] for t in stats["tensors"].values()) == pytest.approx(stats["compress_seconds"])


def test_stats_totals_continue_from_a_loaded_state_dict():
    """A checkpoint carries the totals: a compressor loaded from it reports them, and counts on."""
    model = _model()
    saved = RandomBlock(ratio=0.1, seed=1, named_parameters=model.named_parameters(), **EVERY)
    for step in range(3):
        _backward(model, step)
        for _, p in model.named_parameters():
            saved.compress(p.grad)
    totals = {key: value for key, value in saved.stats().items() if key != "tensors"}
    loaded = RandomBlock(ratio=0.1, seed=1, named_parameters=model.named_parameters(), **EVERY)
    _backward(model, 3)
    loaded.compress(next(model.parameters()).grad)  # counted before the load: the load sets the totals
    loaded.load_state_dict(saved.state_dict())
    assert {key: value for key, value in loaded.stats().items() if key != "tensors"} == totals
    first = next(model.parameters())
    loaded.compress(first.grad)
    after = loaded.stats()
    assert after["calls"] == totals["calls"] + 1 and after["dense_bytes"] == totals["dense_bytes"] + 4 * first.numel()


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(ratio=0.0), ValueError, r"RandomBlock: ratio should be a number in \(0, 1\], got 0.0"),
        (dict(ratio=1.5), ValueError, r"ratio should be a number in \(0, 1\], got 1.5"),
        (dict(ratio="0.1"), ValueError, r"ratio should be a number in \(0, 1\], got '0.1'"),
        (dict(ratio=0.1, seed=-1), ValueError, r"seed should be an integer in \[0, 2\*\*64\), got -1"),
        (dict(ratio=0.1, seed=1.5), ValueError, r"seed should be an integer"),
        (dict(ratio=0.1, error_feedback=1), TypeError, r"error_feedback should be True or False, got 1"),
    ],
)
def test_bad_settings_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        RandomBlock(**kwargs)


def test_bad_bindings_and_unattributable_gradients_fail_loudly():
    model = _model()
    with pytest.raises(TypeError, match="got the module itself; pass model.named_parameters()"):
        RandomBlock(ratio=0.1, named_parameters=model)
    with pytest.raises(ValueError, match="named_parameters is empty"):
        RandomBlock(ratio=0.1, named_parameters=[])
    w, v = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="named_parameters has the name 'a' twice"):
        RandomBlock(ratio=0.1, named_parameters=[("a", w), ("a", v)])

    with pytest.raises(RuntimeError, match=r"needs named_parameters="):
        RandomBlock(ratio=0.1).compress(torch.zeros(3))
    comp = RandomBlock(ratio=0.1, named_parameters=model.named_parameters())
    _backward(model, 0)
    with pytest.raises(LookupError, match=r"not the .grad of any parameter passed as named_parameters="):
        comp.compress(model[0].weight.grad.clone())
    w_int = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"gradients should be float32, float16 or bfloat16, got torch.int64"):
        comp.compress(w_int)


@pytest.mark.parametrize("order", ["backward", "forward", "shuffled"])
def test_every_gradient_is_attributed_whatever_the_order_with_a_step_of_lookups_linear(order):
    """name_of finds each new gradient (zero_grad(set_to_none=True): new tensors every step) in
    any order, and in backward order compares each about once: a pass over the parameters per
    lookup (its old rebuild) made a step quadratic in the number of tensors."""
    from sparsecomm.torch.state import ParameterBinding

    class Counted:  # a parameter whose .grad reads are counted
        reads = 0

        def __init__(self, grad):
            self._grad = grad

        @property
        def grad(self):
            Counted.reads += 1
            return self._grad

    names = [f"layer{i}.weight" for i in range(200)]
    binding = ParameterBinding("TopK", [(n, torch.nn.Parameter(torch.zeros(2))) for n in names])
    for step in range(3):
        grads = {n: torch.full((2,), float(step)) for n in names}
        binding._order = [(n, Counted(grads[n])) for n in names]
        shuffled = torch.randperm(len(names), generator=torch.Generator().manual_seed(step))
        sequence = {"backward": names[::-1], "forward": names, "shuffled": [names[i] for i in shuffled]}[order]
        Counted.reads = 0
        assert [binding.name_of(grads[n]) for n in sequence] == sequence
        if order == "backward":
            assert Counted.reads == len(names)
    with pytest.raises(LookupError, match="not the .grad of any parameter"):
        binding.name_of(torch.zeros(2))


def test_a_tied_parameter_listed_under_two_names_keeps_the_first():
    """named_parameters(remove_duplicate=False) lists a tied weight once per module (Horovod
    accepts that): its state is keyed by the first name."""
    embedding = torch.nn.Embedding(5, 3)
    out = torch.nn.Linear(3, 5, bias=False)
    out.weight = embedding.weight
    model = torch.nn.ModuleDict({"embedding": embedding, "out": out})
    assert [n for n, _ in model.named_parameters(remove_duplicate=False)] == ["embedding.weight", "out.weight"]
    comp = RandomBlock(ratio=1.0, named_parameters=model.named_parameters(remove_duplicate=False), **EVERY)
    out(embedding(torch.tensor([1, 2]))).sum().backward()
    comp.decompress(*comp.compress(embedding.weight.grad))
    assert list(comp.state_dict()["parameters"]) == ["embedding.weight"]


def test_random_k_round_trip_is_the_shared_coordinates_with_error_feedback():
    model = _model()
    comp = RandomK(ratio=0.2, seed=4, named_parameters=model.named_parameters(), **EVERY)
    residuals = {n: torch.zeros(p.numel()) for n, p in model.named_parameters()}
    for step, name, p in _gradients(model, 3):
        index = reference.random_k_indices(
            4, reference.tensor_id(name), step, p.numel(), reference.count(0.2, p.numel())
        )
        acc, u = reference.accumulate(p.grad, residuals[name])
        mask = torch.zeros(p.numel(), dtype=torch.bool)
        mask[index] = True
        want_values, _, residuals[name], _ = reference.send(acc, u, mask, p.dtype, residuals[name])
        values, ctx = comp.compress(p.grad)
        assert torch.equal(values, want_values)
        dense = comp.decompress(values, ctx).reshape(-1)
        assert torch.equal(dense[index], want_values) and dense.count_nonzero() <= len(index)
        assert torch.equal(comp.state.parameters[name].residual, residuals[name])


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: TopK(ratio=0), r"TopK: ratio should be a number in \(0, 1\], got 0"),
        (lambda: TopK(ratio=0.1, error_feedback="yes"), r"TopK: error_feedback should be True or False"),
        (lambda: RandomK(ratio=2), r"RandomK: ratio should be a number in \(0, 1\], got 2"),
        (lambda: RandomK(ratio=0.1, seed=-3), r"RandomK: seed should be an integer in \[0, 2\*\*64\), got -3"),
        (lambda: RTopK(ratio=0.1, r=0.05), r"RTopK: r should be at least ratio=0.1, got 0.05"),
        (lambda: RTopK(ratio=0.1, r=1.5), r"RTopK: r should be a number in \(0, 1\], got 1.5"),
    ],
)
def test_bad_settings_of_every_compressor_are_named(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


@pytest.mark.parametrize(
    "make,message",
    [
        (
            lambda: Threshold(ratio=0.01, quantize="3bit"),
            r"Threshold: quantize should be one of None, 'fp16', 'bf16', "
            r"'1bit', '2bit', got '3bit'",
        ),
        (lambda: Threshold(ratio=0.01, sample_ratio=0), r"Threshold: sample_ratio should be a number in \(0, 1\]"),
        (lambda: DGC(momentum=-0.1), r"DGC: momentum should be a number in \[0, 1\), got -0.1"),
        (lambda: DGC(momentum=1.0), r"DGC: momentum should be a number in \[0, 1\), got 1.0"),
        (lambda: DGC(clip_norm=0), r"DGC: clip_norm should be None or a positive number, got 0"),
        (lambda: DGC(warmup_steps=-1), r"DGC: warmup_steps should be an integer >= 0, got -1"),
        (lambda: DGC(warmup_stages=0), r"DGC: warmup_stages should be an integer >= 1, got 0"),
        (lambda: DGC(momentum_masking=1), r"DGC: momentum_masking should be True or False, got 1"),
        (lambda: DGC(nesterov="yes"), r"DGC: nesterov should be True or False, got 'yes'"),
    ],
)
def test_bad_threshold_and_dgc_settings_are_named(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_dgc_warmup_follows_the_papers_exponential_schedule():
    dgc = DGC(ratio=0.001, warmup_steps=400, warmup_stages=4)
    sparsity = [round(1 - dgc.density(step), 4) for step in (0, 100, 200, 300, 400, 10_000)]
    assert sparsity == [0.7488, 0.9369, 0.9842, 0.996, 0.999, 0.999]  # 75%, 93.75%, 98.4%, 99.6%, 99.9%


def test_rtopk_default_r_is_one_and_a_quarter_times_ratio_capped_at_one():
    assert RTopK(ratio=0.01).method.r == pytest.approx(0.0125) and RTopK(ratio=0.9).method.r == 1.0


def test_the_default_policy_sends_small_and_1d_tensors_dense():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 10), torch.nn.LayerNorm(10))
    comp = RandomBlock(ratio=0.1, named_parameters=model.named_parameters(), dense=["1.*"])
    model(torch.randn(4, 64)).sum().backward()
    kinds = {}
    for name, p in model.named_parameters():
        sent, ctx = comp.compress(p.grad)
        dense = ctx.exchange is EXCHANGES["dense"]
        kinds[name] = "dense" if dense else "sparse"
        assert not dense or (sent is p.grad and comp.decompress(sent, ctx) is p.grad)
    # 0.weight: 2048 elements, compressed; 1.weight: matches "1.*"; biases and the norm: 1-D.
    assert kinds == {
        "0.weight": "sparse",
        "0.bias": "dense",
        "1.weight": "dense",
        "1.bias": "dense",
        "2.weight": "dense",
        "2.bias": "dense",
    }
    small = RandomBlock(ratio=0.1, named_parameters=model.named_parameters(), dense_1d=False, min_numel=0)
    assert not any(small.goes_dense(n, p) for n, p in model.named_parameters())
    assert RandomBlock(ratio=0.1, named_parameters=model.named_parameters(), min_numel=4096).goes_dense(
        "0.weight", model[0].weight
    )


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(min_numel=-1), r"min_numel should be an integer >= 0, got -1"),
        (dict(dense_1d="no"), r"dense_1d should be True or False, got 'no'"),
        (dict(dense="*.bias"), r"dense should be a list of name patterns, got '\*.bias'"),
    ],
)
def test_bad_policy_settings_are_named(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        TopK(ratio=0.1, **kwargs)


def test_gathering_methods_go_dense_when_sparse_would_be_larger():
    """k wire rows (a 2-byte offset and the value) and a marker row against numel values: float32
    goes dense from ratio 2/3, float16 from 1/2; the shared-coordinate methods never do."""
    w32 = torch.nn.Parameter(torch.zeros(100, 100))
    w16 = torch.nn.Parameter(torch.zeros(100, 100, dtype=torch.float16))
    bound = [("w32", w32), ("w16", w16)]
    assert not TopK(ratio=0.66, named_parameters=bound).goes_dense("w32", w32)
    assert TopK(ratio=0.67, named_parameters=bound).goes_dense("w32", w32)
    assert not TopK(ratio=0.49, named_parameters=bound).goes_dense("w16", w16)
    assert TopK(ratio=0.5, named_parameters=bound).goes_dense("w16", w16)
    assert not TopK(ratio=0.9, named_parameters=bound, dense_fallback=False).goes_dense("w32", w32)
    assert DGC(ratio=0.001, warmup_steps=10, named_parameters=bound).goes_dense("w16", w16) is False
    assert not RandomK(ratio=1.0, named_parameters=bound).goes_dense("w32", w32)
    with pytest.raises(TypeError, match="Threshold: dense_fallback should be True or False, got 'no'"):
        Threshold(dense_fallback="no")


HUGE = (2**16, 2**15)  # 2**31 elements: one more than int32 indices address


def _huge_parameter():
    """A parameter of 2**31 elements and its gradient that take no memory (expanded views)."""
    p = torch.nn.Parameter(torch.zeros(1, 1).expand(*HUGE))
    p.grad = torch.zeros(1, 1).expand(*HUGE)
    return p


@pytest.mark.parametrize(
    "make",
    [
        lambda named: TopK(ratio=0.01, named_parameters=named),
        lambda named: RTopK(ratio=0.01, named_parameters=named),
        lambda named: Threshold(ratio=0.01, quantize="2bit", named_parameters=named),
        lambda named: DGC(ratio=0.01, named_parameters=named, exchange="spardl"),
        lambda named: DGC(ratio=0.3, warmup_steps=10, warmup_stages=1, named_parameters=named),  # stage 0 dense
        lambda named: RandomK(ratio=0.01, named_parameters=named),
    ],
    ids=["TopK", "RTopK", "Threshold", "DGC", "DGC-dense-first-stage", "RandomK"],
)
def test_a_gradient_beyond_int32_indices_is_refused_before_any_collective(make):
    """Refused on the first compress, before the settings check and the network measurement
    start their collectives (here on 2 pretended ranks), naming the compressor, the
    parameter, the count, the limit and what to do. Binding such a parameter (frozen, say) is fine."""
    p = _huge_parameter()
    comp = make([("embedding.weight", p)])

    def collective(*args):
        raise AssertionError("a collective started")

    comp._ranks, comp._allgather_ints, comp._measure_network = (lambda: 2), collective, collective
    owner = type(comp).__name__
    with pytest.raises(
        ValueError,
        match=(
            rf"^{owner}: 'embedding.weight' has 2147483648 elements, more than 2147483647 \(2\*\*31 - 1\), the most "
            rf"that int32 indices can address, so it cannot be sent sparse. List it in dense=\['embedding.weight'\] "
            rf"to send it dense through Horovod's allreduce, or split the parameter into tensors of at most "
            rf"2147483647 elements.$"
        ),
    ):
        comp.compress(p.grad)
    assert comp.stats()["calls"] == 0 and comp.state.parameters["embedding.weight"].residual is None


@pytest.mark.parametrize(
    "make",
    [
        lambda named: TopK(ratio=0.01, named_parameters=named, dense=["embedding.*"]),
        lambda named: Threshold(ratio=0.01, named_parameters=named, min_numel=2**32),
        lambda named: RandomK(ratio=0.01, named_parameters=named, dense_1d=True, dense=["embedding.weight"]),
        lambda named: TopK(ratio=0.7, named_parameters=named),  # the dense fallback: sparse would be larger
    ],
    ids=["dense=", "min_numel", "RandomK-dense=", "dense-fallback"],
)
def test_a_gradient_beyond_int32_indices_routed_dense_goes_to_horovod_untouched(make):
    p = _huge_parameter()
    comp = make([("embedding.weight", p)])
    handed, ctx = comp.compress(p.grad)
    assert handed is p.grad and ctx.exchange is EXCHANGES["dense"]  # nothing copied: no int32 limit there
    assert comp.decompress(handed, ctx) is handed


def test_a_densified_sparse_gradient_is_attributed_when_unambiguous():
    """hvd.DistributedOptimizer(sparse_as_dense=True) hands compress p.grad.to_dense()."""
    torch.manual_seed(0)
    one = torch.nn.Embedding(50, 30, sparse=True)
    comp = RandomBlock(ratio=0.5, named_parameters=[("one.weight", one.weight)], **EVERY)
    one(torch.tensor([1, 2, 3])).sum().backward()
    values, ctx = comp.compress(one.weight.grad.to_dense())
    assert "one.weight" in comp.state.parameters and values.numel() == 750
    two = torch.nn.Embedding(50, 30, sparse=True)
    comp = RandomBlock(ratio=0.5, named_parameters=[("one.weight", one.weight), ("two.weight", two.weight)], **EVERY)
    two(torch.tensor([4])).sum().backward()
    with pytest.raises(LookupError, match=r"could belong to \['one.weight', 'two.weight'\]"):
        comp.compress(one.weight.grad.to_dense())


def test_every_compressor_conserves_the_gradient_over_steps(tmp_path):
    """Over 20 steps (1 rank, real Horovod): total applied update + final residual == total
    gradient, per parameter, to float32 rounding, for every compressor."""
    from launch import horovodrun

    horovodrun(1, "torch_conservation.py", "--out", tmp_path)
    results = torch.load(tmp_path / "rank0.pt")
    assert len(results) == 8
    for config, r in results.items():
        for name in r["grad"]:
            torch.testing.assert_close(
                r["sent"][name] + r["residual"][name],
                r["grad"][name],
                rtol=0,
                atol=1e-5,
                msg=lambda m: f"{config} {name}: {m}",
            )
            assert r["residual"][name].abs().sum() > 0, (config, name)  # something was held back


def test_spardl_sends_each_owner_the_markers_of_its_block_only():
    """The wire of SparDL's phases (sparsecomm.core.wire) on a tensor of 5 buckets split over 3
    owners: each block's send holds its pairs and one marker row per bucket its range touches
    (2, 3 and 2 of the tensor's 5), and reads back to indices inside the block; the owner's
    reduced rows too. One process: the exchange's own split and reduce, without Horovod."""
    from sparsecomm.core.exchange import Packed
    from sparsecomm.core.plan import SparDLLayout
    from sparsecomm.torch.exchange import Wire, spardl_reduce, spardl_split
    from sparsecomm.torch.ops import wire_columns

    numel, ranks, k = 300_000, 3, 3000
    layout = SparDLLayout.of(numel, k, ranks)
    gen = torch.Generator().manual_seed(0)
    index = torch.randperm(numel, generator=gen)[:k].sort().values.int()
    packed = Packed(values=torch.randn(k, generator=gen), index=index)
    rows = spardl_split(packed, layout, 0, torch.zeros(numel))
    for owner, sent in enumerate(rows):
        low, high = owner * 100_000, (owner + 1) * 100_000
        inside = int(((index >= low) & (index < high)).sum())
        _, got = wire_columns(sent, torch.float32)
        assert sent.shape == (got.numel() + [2, 3, 2][owner], 6)
        assert got.numel() == (inside if owner == 0 else min(inside, 1000))  # its own block whole
        assert bool(((got >= low) & (got < high)).all())
    wire = Wire("w", torch.Size([numel]), torch.float32, None, ranks, k, torch.zeros(numel), torch.empty(numel))
    reduced = spardl_reduce([rows[0]] * ranks, layout, 0, torch.float32, wire)
    assert reduced.shape[0] == min(int((index < 100_000).sum()), 1000) + 2  # the kept sums and 2 markers
