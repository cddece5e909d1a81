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


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize(
    "make, reads_counts",
    [
        (lambda m: sct.Threshold(ratio=0.05, exchange="allgather", named_parameters=m), False),
        (lambda m: sct.DGC(ratio=0.05, exchange="allgather", named_parameters=m), False),
        (lambda m: sct.TopK(ratio=0.05, exchange="allgather", named_parameters=m), False),
        (lambda m: sct.Threshold(ratio=0.05, quantize="2bit", exchange="allgather", named_parameters=m), True),
    ],
    ids=["Threshold", "DGC", "TopK", "Threshold_2bit"],
)
def test_a_bucket_of_rows_is_unpacked_without_reading_its_counts_on_the_host(monkeypatch, make, reads_counts):
    """The gathered rows' counts are read by the unpack op where it runs (on a GPU, no wait a
    bucket); only 1-/2-bit segments still read them on the host (docs/kernels.md)."""
    read = []
    counts = sct.ddp_parts._counts
    monkeypatch.setattr(sct.ddp_parts, "_counts", lambda *args: read.append(1) or counts(*args))
    model = common.torch_model()
    compression = make(model.named_parameters())
    step(model, compression)
    assert bool(read) == reads_counts
    assert any(s["exchange"] == "allgather" for s in compression.stats()["tensors"].values())


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
}
READ = {"Threshold_2bit": [("tolist", "torch/ddp_parts.py:_counts")]}  # (docs/kernels.md), the recorder's control


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize("host_binding", ["cuda-emulated"], indirect=True)
@pytest.mark.parametrize("method", list(ON_GATHERED_ROUTES))
def test_a_step_on_the_allgather_and_spardl_routes_reads_nothing_on_the_host(host_binding, method):
    """DDP's backward with the hook on the emulated CUDA binding, after the first step (which
    checks the settings): no read of tensor data by sparsecomm's Python, in any thread, and none
    by the binding (its packs at fixed capacity, their counts kept on the device, rTop-k's top r
    too; SparDL's blocks chosen there). 2-bit segments still read their counts (the recorder's
    control). stats() reads the counts."""
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
        if step:  # (2-bit: a read a bucket, of one bucket here; the binding reads each rank's count)
            assert reads == READ.get(method, [])
            assert (binding_reads() - before > 0) == (method in READ)
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
# included) and the rows' unpack (3), whatever the number of tensors
HOOK_LAUNCHES = {"Threshold": 19, "DGC": 19, "TopK": 19}


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize("host_binding", ["cuda-emulated"], indirect=True)
@pytest.mark.parametrize("method", list(HOOK_LAUNCHES))
def test_a_bucket_of_4_or_161_tensors_launches_the_same_kernels(host_binding, method):
    """The whole hook of a step on the allgather route, at most 24 kernels a bucket (issue 58's bound)."""
    make = lambda m: ON_GATHERED_ROUTES[method](m)  # noqa: E731
    counts = [hook_launches(make, count) for count in (4, 161)]
    assert counts == [HOOK_LAUNCHES[method]] * 2 and counts[0] <= 24
