"""sparsecomm.torch.ddp_hook in one process (a Gloo group of one rank): the whole path of a
step, and what it refuses, each with an error that names the argument. Several ranks:
tests/multirank/test_ddp.py."""

import common
import pytest
import torch
import torch.distributed as dist
from launch import free_port

import sparsecomm.torch as sct
from sparsecomm.core.selection import selected_count


@pytest.fixture
def group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    sct.destroy_process_group()  # the next test's init fails if it did not


def test_destroy_process_group_ends_the_group_and_keeps_its_last_work_to_exit(group):
    sub = dist.new_group([0])
    held = len(sct.ddp._LAST_WORKS)
    sct.destroy_process_group(sub)
    assert dist.is_initialized() and len(sct.ddp._LAST_WORKS) == held + 1
    with pytest.raises(ValueError, match="not registered"):
        dist.get_rank(sub)


def step(model, compression, lr=0.5):
    """One SGD step of DDP over `model` with the hook; returns the model's parameters after it."""
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(compression, sct.ddp_hook)
    x, y = common.digits()
    loss = torch.nn.functional.cross_entropy(ddp(torch.from_numpy(x[:16])), torch.from_numpy(y[:16]))
    loss.backward()
    torch.optim.SGD(ddp.parameters(), lr=lr).step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize(
    "cls, exchange",
    [
        (sct.TopK, "allgather"),
        (sct.TopK, "spardl"),
        (sct.Threshold, "allgather"),
        (sct.DGC, "allgather"),
        (sct.RandomBlock, None),
    ],
)
def test_at_ratio_one_on_one_rank_the_step_is_plain_sgd(cls, exchange):
    plain = common.torch_model()
    x, y = common.digits()
    torch.nn.functional.cross_entropy(plain(torch.from_numpy(x[:16])), torch.from_numpy(y[:16])).backward()
    torch.optim.SGD(plain.parameters(), lr=0.5).step()
    model = common.torch_model()
    settings = {"seed": 1} if cls is sct.RandomBlock else {"dense_fallback": False, "exchange": exchange}
    if cls is sct.DGC:
        settings.update(momentum=0.0, momentum_masking=False)
    compression = cls(ratio=1.0, named_parameters=model.named_parameters(), min_numel=0, dense_1d=False, **settings)
    after = step(model, compression)
    for name, p in plain.named_parameters():
        assert torch.equal(after[name], p.detach()), name
    assert compression.stats()["calls"] == 4


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize(
    "settings, error, message",
    [
        (dict(process_set="all"), TypeError, r"TopK: under ddp_hook, process_set should be a torch.distributed"),
        (dict(exchange="hierarchical"), ValueError, r"TopK: exchange='hierarchical' runs on Horovod's process sets"),
    ],
)
def test_what_the_hook_cannot_run_is_refused_naming_the_argument(settings, error, message):
    model = common.torch_model()
    compression = sct.TopK(ratio=0.1, named_parameters=model.named_parameters(), **settings)
    with pytest.raises(error, match=message):
        step(model, compression)


@pytest.mark.usefixtures("group")
def test_sparse_gradients_are_refused_with_the_reason():
    """DDP hands a hook a bucket of sparse gradients (an embedding with sparse=True) without
    its gradients: passing it through would skip the exchange."""
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(100, 8, sparse=True), torch.nn.Linear(8, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(sct.TopK(ratio=0.1, named_parameters=model.named_parameters()), sct.ddp_hook)
    with pytest.raises(
        RuntimeError, match=r"TopK: ddp_hook got a bucket of sparse gradients \(shapes \[\[100, 8\]\]\)"
    ):
        ddp(torch.tensor([[1, 2], [3, 4]])).sum().backward()


@pytest.mark.usefixtures("group")
def test_parameters_of_another_model_are_refused():
    model = common.torch_model()
    compression = sct.TopK(ratio=0.1, named_parameters=common.torch_model().named_parameters())
    with pytest.raises(LookupError, match=r"TopK: a parameter of shape \[[\d, ]+\] is not among the named_parameters="):
        step(model, compression)


BUCKET_UNPACKS = ("sparse_unpack_gathered_rows", "sparse_unpack_gathered_segments")
TENSOR_UNPACKS = ("sparse_unpack_rows", "sparse_unpack_segments")  # (Horovod's: they read each rank's count)


def _gathered(cls, **settings):
    """A compressor of `cls` at 5% on the allgather route, over the parameters it is given."""

    def make(named_parameters):
        return cls(ratio=0.05, exchange="allgather", named_parameters=named_parameters, **settings)

    return make


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize(
    "make, unpack",
    [
        (_gathered(sct.Threshold), BUCKET_UNPACKS[0]),
        (_gathered(sct.DGC), BUCKET_UNPACKS[0]),
        (_gathered(sct.TopK), BUCKET_UNPACKS[0]),
        (_gathered(sct.Threshold, quantize="1bit"), BUCKET_UNPACKS[1]),
        (_gathered(sct.Threshold, quantize="2bit"), BUCKET_UNPACKS[1]),
    ],
    ids=["Threshold", "DGC", "TopK", "Threshold_1bit", "Threshold_2bit"],
)
def test_a_bucket_is_unpacked_by_one_op_that_reads_its_counts_where_it_runs(monkeypatch, make, unpack):
    """The gathered rows' and 1-/2-bit segments' counts are read by the bucket's unpack op where it
    runs (on a GPU, no wait a bucket): one op a bucket, never a tensor-at-a-time unpack."""
    calls = []
    for name in BUCKET_UNPACKS + TENSOR_UNPACKS:
        original = getattr(sct.ops, name)
        monkeypatch.setattr(
            sct.ops, name, lambda *a, _name=name, _op=original, **k: calls.append(_name) or _op(*a, **k)
        )
    model = common.torch_model()
    compression = make(model.named_parameters())
    step(model, compression)
    assert calls and set(calls) == {unpack}
    assert any(s["exchange"] == "allgather" for s in compression.stats()["tensors"].values())


def _counted(m):
    """TopK whose bucket packs read their counts on the host (pack_sampled_many, not at fixed
    capacity): the control of the binding's read counter."""
    compression = sct.TopK(ratio=0.05, exchange="allgather", named_parameters=m, **common.EVERY)
    deferred = compression.packs.deferred
    compression.packs.deferred = lambda fixed=False: deferred(False)
    return compression


def _scaled(cls, **settings):
    """A compressor under a GradScaler (not stepped: its scale stays the initial one, read on no
    step): each pack's overflow mark reads its values before the exchange."""

    def make(named_parameters):
        scaler = torch.amp.GradScaler("cpu")
        return _gathered(cls, loss_scaler=scaler, **common.EVERY, **settings)(named_parameters)

    return make


ON_GATHERED_ROUTES = {
    "Threshold": lambda m: sct.Threshold(ratio=0.05, exchange="allgather", named_parameters=m, **common.EVERY),
    "DGC": lambda m: sct.DGC(ratio=0.05, exchange="allgather", named_parameters=m, **common.EVERY),
    "TopK": lambda m: sct.TopK(ratio=0.05, exchange="allgather", named_parameters=m, **common.EVERY),
    "Threshold_2bit": lambda m: sct.Threshold(
        ratio=0.05, quantize="2bit", exchange="allgather", named_parameters=m, **common.EVERY
    ),
    "RTopK": lambda m: sct.RTopK(ratio=0.05, r=0.2, exchange="allgather", named_parameters=m, **common.EVERY),
    "Threshold_spardl": lambda m: sct.Threshold(ratio=0.05, exchange="spardl", named_parameters=m, **common.EVERY),
    "DGC_spardl": lambda m: sct.DGC(ratio=0.05, exchange="spardl", named_parameters=m, **common.EVERY),
    "TopK_spardl": lambda m: sct.TopK(ratio=0.05, exchange="spardl", named_parameters=m, **common.EVERY),
    "RTopK_spardl": lambda m: sct.RTopK(ratio=0.05, exchange="spardl", named_parameters=m, **common.EVERY),
    "Threshold_2bit_loss_scaled": _scaled(sct.Threshold, quantize="2bit"),  # (its NaN mark: the scales, no cut)
    "TopK_loss_scaled": _scaled(sct.TopK),
    "TopK_counted": _counted,
}
# The reads that stay (docs/kernels.md), each recorder's control: the loss scaler's overflow mark
# cuts each pack's values to its count (a host read a tensor, its pack run alone), and the packs
# made tensor-size (not at fixed capacity) read their counts inside the binding.
READ = {"TopK_loss_scaled": [("tolist", "torch/sampled_packs.py:__call__")] * 4}
BINDING_READS = {"TopK_counted"}


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize("host_binding", ["cuda-emulated"], indirect=True)
@pytest.mark.parametrize("method", list(ON_GATHERED_ROUTES))
def test_a_step_on_the_allgather_and_spardl_routes_reads_nothing_on_the_host(host_binding, method):
    """DDP's backward with the hook on the emulated CUDA binding, after the first step (which
    checks the settings): no read of tensor data by sparsecomm's Python, in any thread, and none
    by the binding (its packs at fixed capacity, their counts kept on the device, rTop-k's top r
    too, 1-/2-bit segments written and read at fixed offsets; SparDL's blocks chosen there). READ
    and BINDING_READS are the recorders' controls. stats() reads the counts."""
    from host_reads import patched_reads

    model = common.torch_model()
    compression = ON_GATHERED_ROUTES[method](model.named_parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(compression, sct.ddp_hook)
    binding_reads, (x, y) = torch.ops.sparsecomm_cuda_emulation.host_reads, common.digits()
    for step in range(3):
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(torch.from_numpy(x[:16])), torch.from_numpy(y[:16]))
        before = binding_reads()
        with patched_reads() as reads:
            loss.backward()
        if step:
            assert reads == READ.get(method, [])
            assert (binding_reads() - before > 0) == (method in BINDING_READS)
    tensors = compression.stats()["tensors"]
    assert {s["exchange"] for s in tensors.values()} == {"spardl" if "spardl" in method else "allgather"}
    if method == "TopK":  # exactly k a step, counted on the device (on one rank SparDL sends nothing)
        for name, param in model.named_parameters():
            assert tensors[name]["sent_elements"] == 3 * selected_count(0.05, param.numel())


class Matrices(torch.nn.Module):
    """`count` parameters of 64x64 and a linear loss: each gradient is a fixed random matrix."""

    def __init__(self, count):
        super().__init__()
        gen = torch.Generator().manual_seed(count)
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(64, 64, generator=gen)) for _ in range(count)
        )
        self.factors = [torch.randn(64, 64, generator=gen) for _ in range(count)]

    def forward(self):
        return sum((w * f).sum() for w, f in zip(self.weights, self.factors))


def hook_launches(make, count):
    """The CUDA kernels one DDP step launches through the emulated binding, its `count` gradients in
    one bucket, after a first step (which checks the settings and builds DDP's buckets)."""
    launched = torch.ops.sparsecomm_cuda_emulation.launches
    model = Matrices(count)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=64, gradient_as_bucket_view=True)
    ddp.register_comm_hook(make(model.named_parameters()), sct.ddp_hook)
    for _ in range(2):
        before = launched()
        ddp().backward()
    return launched() - before


# A bucket's kernels (docs/kernels.md, "Launches"): the packs at fixed capacity (16, their wire rows
# or 1-/2-bit segments included) and their unpack (3), whatever the number of tensors
HOOK_LAUNCHES = {"Threshold": 19, "DGC": 19, "TopK": 19, "Threshold_2bit": 19}


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize("host_binding", ["cuda-emulated"], indirect=True)
@pytest.mark.parametrize("method", list(HOOK_LAUNCHES))
def test_a_bucket_of_4_or_161_tensors_launches_the_same_kernels(host_binding, method):
    """The whole hook of a step on the allgather route, at most 24 kernels a bucket."""
    make = lambda m: ON_GATHERED_ROUTES[method](m)  # noqa: E731
    counts = [hook_launches(make, count) for count in (4, 161)]
    assert counts == [HOOK_LAUNCHES[method]] * 2 and counts[0] <= 24
