"""A bucket prepared in one pass (sparsecomm.torch.bucket: the DDP and FSDP hooks' way) against the
same tensors prepared one by one (Compressor.prepare: Horovod's way), over 30 steps of every
method: the same routes, the same payloads and the same states, bit for bit, through the CPU
binding and the emulated CUDA one. One process, no collective."""

import pytest
import torch

import sparsecomm.torch as sct
from sparsecomm.core import wire

# A bucket's shapes: matrices of several sizes, a 1-D tensor and one below min_numel (both dense
# by the default policy), matrices whose k is a few elements, and two large enough that their
# threshold samples a part of them (so that each one's selection stream matters)
SHAPES = [(64, 48), (5, 200), (1500,), (30, 30), (16, 16), (7, 300), (129, 33), (200, 100), (300, 150)]
STEPS = 30
EVERY = dict(exchange="allgather")
METHODS = {
    "TopK": lambda n: sct.TopK(ratio=0.02, named_parameters=n, **EVERY),
    "Threshold": lambda n: sct.Threshold(ratio=0.02, named_parameters=n, **EVERY),
    "Threshold_fp16": lambda n: sct.Threshold(ratio=0.02, quantize="fp16", named_parameters=n, **EVERY),
    "Threshold_2bit": lambda n: sct.Threshold(ratio=0.02, quantize="2bit", named_parameters=n, **EVERY),
    "DGC": lambda n: sct.DGC(ratio=0.02, named_parameters=n, **EVERY),
    "DGC_warmup_clip": lambda n: sct.DGC(
        ratio=0.01, warmup_steps=12, clip_norm=0.5, nesterov=True, named_parameters=n, **EVERY
    ),
    "DGC_spardl": lambda n: sct.DGC(ratio=0.02, named_parameters=n, exchange="spardl"),
    "RTopK": lambda n: sct.RTopK(ratio=0.02, r=0.1, named_parameters=n, **EVERY),
    "RandomK": lambda n: sct.RandomK(ratio=0.05, named_parameters=n),
    "RandomBlock": lambda n: sct.RandomBlock(ratio=0.05, named_parameters=n),
}


def model():
    gen = torch.Generator().manual_seed(0)
    return [(f"layer{i}.weight", torch.nn.Parameter(torch.randn(s, generator=gen))) for i, s in enumerate(SHAPES)]


def sent(payload):
    """What a payload sends, as plain tensors: a fixed-capacity pack cut to its count."""
    fixed = payload.fixed
    if fixed is not None and payload.bits is not None:
        count = int(fixed.count)
        return [fixed.index[:count], fixed.codes[: wire.code_bytes(count, payload.bits)], fixed.scales]
    if fixed is not None:
        count = int(fixed.count)
        return [fixed.values[:count], fixed.index[:count]]
    if payload.bits is not None:
        return [payload.index, payload.codes, payload.scales]
    return [t for t in (payload.values, payload.index) if t is not None]


def assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(
        a.view(torch.uint8) if a.is_floating_point() else a, b.view(torch.uint8) if b.is_floating_point() else b
    )


@pytest.mark.usefixtures("host_binding")
@pytest.mark.parametrize("method", list(METHODS))
def test_a_bucket_prepares_as_its_tensors_one_by_one(method):
    """Each step: the bucket's routes and k, each tensor's payload and, after the steps, every state."""
    batched, one_by_one = model(), model()
    ours, theirs = METHODS[method](batched), METHODS[method](one_by_one)
    params = [p for _, p in batched]
    gen = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        grads = [torch.randn(s, generator=gen) for s in SHAPES]
        routing = ours.routing(grads[0].device)
        bucket = ours.bucket_of(params, grads)
        with ours.packs.deferred(fixed=True):
            routes, payloads = bucket.prepare(ours, [g.clone() for g in grads], routing)
        for i, grad in enumerate(grads):
            state, route, payload, k, _ = theirs.prepare(grad.clone(), theirs.state.named(f"layer{i}.weight"))
            assert (routes.routes[i], routes.ks[i]) == (route, k), (step, i)
            for a, b in zip(sent(payloads[i]), sent(payload), strict=True):
                assert_same(a, b)
    for name, _ in batched:
        a, b = ours.state.named(name), theirs.state.named(name)
        assert a.step == b.step
        for x, y in ((a.residual, b.residual), (a.momentum, b.momentum)):
            assert (x is None) == (y is None)
            if x is not None:
                assert_same(x, y)


@pytest.mark.usefixtures("host_binding")
def test_a_bucket_keeps_its_routes_while_they_stand_and_decides_them_again_when_not():
    """The steady state decides nothing per tensor; a new density (DGC's warm-up stage) or a
    dropped measurement (Planner.epoch) decides again."""
    named = model()
    dgc = sct.DGC(ratio=0.01, warmup_steps=4, warmup_stages=2, named_parameters=named, exchange="allgather")
    params = [p for _, p in named]
    seen = []
    for _ in range(6):
        grads = [torch.randn(s) for s in SHAPES]
        bucket = dgc.bucket_of(params, grads)
        with dgc.packs.deferred(fixed=True):
            routes, _ = bucket.prepare(dgc, grads, dgc.routing(grads[0].device))
        seen.append(routes)
    # stages at steps 0-1, 2-3, then the ratio: three decisions, each kept for the stage's steps
    assert [seen[i] is seen[i + 1] for i in range(5)] == [True, False, True, False, True]
    dgc.planner.forget_measurement()
    grads = [torch.randn(s) for s in SHAPES]
    with dgc.packs.deferred(fixed=True):
        routes, _ = dgc.bucket_of(params, grads).prepare(dgc, grads, dgc.routing(grads[0].device))
    assert routes is not seen[-1] and routes.routes == seen[-1].routes
