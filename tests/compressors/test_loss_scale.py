"""Mixed precision in one process: the framework-free rule (sparsecomm/core/loss_scale.py),
the loss_scaler= argument of the torch compressors, and what compress does with it (rollback,
rescale, the backup buffers, NaN in the payload of a non-finite gradient, checkpoints).
Training on 2 ranks against training without the overflowed step: test_multirank_torch_loss_scale.py."""

import pytest
import torch
from common import EVERY

from sparsecomm.core import loss_scale
from sparsecomm.core.loss_scale import UNSET, decide
from sparsecomm.torch import DGC, RandomBlock, RandomK, RTopK, Threshold, TopK
from sparsecomm.torch.loss_scaling import LossScaling

ALL = [
    lambda **kw: DGC(ratio=0.1, **kw),
    lambda **kw: Threshold(ratio=0.1, **kw),
    lambda **kw: Threshold(ratio=0.1, quantize="1bit", **kw),
    lambda **kw: TopK(ratio=0.1, **kw),
    lambda **kw: RTopK(ratio=0.1, **kw),
    lambda **kw: RandomK(ratio=0.1, **kw),
    lambda **kw: RandomBlock(ratio=0.1, **kw),
]


# -- the rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "remembered,current,backed_up,rollback,factor",
    [
        (UNSET, 1024.0, False, False, 1.0),  # first update: remember the scale, nothing to change
        (UNSET, 1024.0, True, False, 1.0),
        (1024.0, 1024.0, True, False, 1.0),  # unchanged
        (1024.0, 2048.0, True, False, 2.0),  # grew after good steps: rescale up
        (1024.0, 512.0, True, True, 0.5),  # lowered: the last update's step overflowed; roll back, rescale
        (1024.0, 512.0, False, False, 0.5),  # lowered, no backup (restored from a checkpoint): rescale only
        (1024.0, 256.0, True, True, 0.25),
    ],
)
def test_the_rule_decides_from_the_remembered_and_the_current_scale(remembered, current, backed_up, rollback, factor):
    decision = decide(remembered, current, backed_up)
    assert decision.rollback is rollback and decision.factor == factor


def test_the_rule_runs_on_any_select():
    """The same arithmetic with a `select` that records its use, as tf.where would."""
    calls = []

    def select(condition, then, otherwise):
        calls.append(condition)
        return then if condition else otherwise

    assert decide(2.0**10, 2.0**9, True, select=select) == loss_scale.Decision(True, 0.5)
    assert len(calls) == 2


@pytest.mark.parametrize(
    "backoff,growth,message",
    [
        (
            1.0,
            2.0,
            r"X: loss_scaler's backoff_factor should be in \(0, 1\): an overflow is detected from a lowered "
            r"scale; got 1.0",
        ),
        (0.0, 2.0, r"backoff_factor should be in \(0, 1\).*got 0.0"),
        (0.5, 1.0, r"X: loss_scaler's growth_factor should be > 1: a lowered scale must mean an overflow; got 1.0"),
        (0.5, True, r"growth_factor should be > 1.*got True"),
    ],
)
def test_the_scalers_factors_are_checked(backoff, growth, message):
    with pytest.raises(ValueError, match=message):
        loss_scale.check_factors("X", backoff, growth)
    loss_scale.check_factors("X", 0.5, 2.0)


def test_dgc_clipping_threshold_follows_the_scale():
    method = DGC(ratio=0.1, clip_norm=0.5).method
    assert method.clip_limit(4) == 0.25 and method.clip_limit(4, 1024.0) == 256.0
    assert DGC(ratio=0.1).method.clip_limit(4, 1024.0) is None


# -- the argument ------------------------------------------------------------------------------


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.ReLU(), torch.nn.Linear(30, 3))


def _scaler(scale=2.0**10, **kwargs):
    scaler = torch.amp.GradScaler("cpu", init_scale=scale, **kwargs)
    scaler.scale(torch.ones(()))  # creates the scale tensor (update(new_scale=) needs it)
    return scaler


@pytest.mark.parametrize("make", ALL)
def test_loss_scaler_must_be_a_grad_scaler(make):
    model = _model()
    owner = type(make()).__name__
    with pytest.raises(
        TypeError,
        match=f"{owner}: loss_scaler should be None or the torch.amp.GradScaler that scales the loss, got float",
    ):
        make(named_parameters=model.named_parameters(), loss_scaler=1024.0)
    assert make(loss_scaler=_scaler()).loss_scaling is not None


def test_a_scaler_that_does_not_lower_its_scale_on_overflow_is_refused():
    scaler = _scaler()
    scaler.set_backoff_factor(1.0)
    with pytest.raises(ValueError, match=r"TopK: loss_scaler's backoff_factor should be in \(0, 1\)"):
        TopK(ratio=0.1, loss_scaler=scaler)
    scaler = _scaler()
    scaler.set_growth_factor(0.5)
    with pytest.raises(ValueError, match=r"DGC: loss_scaler's growth_factor should be > 1"):
        DGC(loss_scaler=scaler)
    # changed after construction: refused at the next compress
    model, scaler = _model(), _scaler()
    comp = RandomBlock(ratio=0.1, named_parameters=model.named_parameters(), loss_scaler=scaler, **EVERY)
    model(torch.ones(2, 40)).sum().backward()
    scaler.set_backoff_factor(1.0)
    with pytest.raises(ValueError, match=r"RandomBlock: loss_scaler's backoff_factor should be in \(0, 1\)"):
        comp.compress(model[0].weight.grad)


def test_a_disabled_scaler_scales_nothing_and_is_ignored():
    comp = RandomBlock(ratio=0.1, loss_scaler=torch.amp.GradScaler("cpu", enabled=False))
    assert comp.loss_scaling is None


# -- compress under a scaler -------------------------------------------------------------------


def _grads(model, seed, scale):
    model.zero_grad(set_to_none=True)
    generator = torch.Generator().manual_seed(seed)
    (model(torch.randn(5, 40, generator=generator)).square().sum() * scale).backward()


@pytest.mark.parametrize("make", [RandomBlock, RandomK])
def test_scaled_steps_with_an_overflow_equal_unscaled_steps_without_it(make):
    """Scales 16, 16, 32 (growth), 32 (overflow on one element), 16, 16: the results divided by
    the scale, the residuals and the steps equal those of unscaled steps 0, 1, 2, 4, 5."""
    scales, overflow = [16.0, 16.0, 32.0, 32.0, 16.0, 16.0], 3
    scaled_model, model, scaler = _model(), _model(), _scaler(16.0)
    scaled = make(ratio=0.2, seed=3, named_parameters=scaled_model.named_parameters(), loss_scaler=scaler, **EVERY)
    plain = make(ratio=0.2, seed=3, named_parameters=model.named_parameters(), **EVERY)
    got, want = {}, {}
    for step, scale in enumerate(scales):
        scaler.update(new_scale=scale)
        _grads(scaled_model, step, scale)
        if step == overflow:
            scaled_model[0].weight.grad[0, 0] = float("inf")
        for name, p in scaled_model.named_parameters():
            values, ctx = scaled.compress(p.grad)
            got[step, name] = scaled.decompress(values, ctx) / scale
    for step in (0, 1, 2, 4, 5):
        _grads(model, step, 1.0)
        for name, p in model.named_parameters():
            values, ctx = plain.compress(p.grad)
            want[step, name] = plain.decompress(values, ctx).clone()
    assert not torch.isfinite(got[overflow, "0.weight"]).all()
    for key in want:
        assert torch.equal(got[key], want[key]), key
    for name, state in scaled.state.parameters.items():
        assert state.step == plain.state.parameters[name].step == 5
        assert torch.equal(state.residual / scales[-1], plain.state.parameters[name].residual), name


@pytest.mark.parametrize("make", ALL)
def test_a_non_finite_gradient_sends_a_nan_first(make):
    """Whatever was selected: the first sent value is NaN (quantized: every scale), and only
    when the gradient holds an inf or NaN; the payload is otherwise the unscaled compressor's."""
    p = torch.nn.Parameter(torch.zeros(64, 64))
    comp = make(named_parameters=[("w", p)], loss_scaler=_scaler(), **EVERY)
    plain = make(named_parameters=[("w", p)], **EVERY)
    generator = torch.Generator().manual_seed(0)
    for bad in (None, float("inf"), -float("inf"), float("nan")):
        p.grad = torch.randn(64, 64, generator=generator)
        if bad is not None:
            p.grad[63, 60:] = bad  # 4 elements: more than some of the methods select
        payload = LossScaling.back_up_and_pack(comp, p.grad.clone(), comp.state.for_gradient(p.grad), "sparse", 0.1)
        expected = plain.pack(p.grad.clone(), plain.state.for_gradient(p.grad), 0.1)
        assert payload.start == expected.start and (payload.index is None or torch.equal(payload.index, expected.index))
        if payload.bits is None:
            assert bool(torch.isnan(payload.values[0])) == (bad is not None)
            torch.testing.assert_close(payload.values[1:], expected.values[1:], rtol=0, atol=0, equal_nan=True)
            if bad is None:
                assert torch.equal(payload.values, expected.values)
        else:
            assert bool(torch.isnan(payload.scales).all()) == (bad is not None)
            assert torch.equal(payload.codes, expected.codes)
            if bad is None:
                assert torch.equal(payload.scales, expected.scales)


def test_the_backup_is_copied_into_buffers_allocated_once():
    model, scaler = _model(), _scaler()
    comp = DGC(
        ratio=0.1,
        named_parameters=model.named_parameters(),
        loss_scaler=scaler,
        dense_fallback=False,
        exchange="allgather",
        **EVERY,
    )
    pointers = []
    for step in range(4):  # the first backup has no residual or momentum yet (the first update makes them)
        _grads(model, step, 1024.0)
        state = comp.state.for_gradient(model[0].weight.grad)
        LossScaling.follow(state, scaler.get_scale())
        LossScaling.back_up_and_pack(comp, model[0].weight.grad, state, "allgather", 0.1)
        if step:
            pointers.append((state.backup.residual.data_ptr(), state.backup.momentum.data_ptr()))
    assert pointers[0] == pointers[1] == pointers[2]


def test_without_a_scaler_nothing_is_backed_up_or_remembered():
    model = _model()
    comp = RandomBlock(ratio=0.1, named_parameters=model.named_parameters(), **EVERY)
    _grads(model, 0, 1.0)
    for _, p in model.named_parameters():
        comp.decompress(*comp.compress(p.grad))
    assert all(s.backup is None and s.loss_scale == UNSET for s in comp.state.parameters.values())
    assert all(entry["loss_scale"] == UNSET for entry in comp.state_dict()["parameters"].values())


def test_a_rollback_restores_the_state_before_a_first_update_as_zeros():
    """An overflow on the very first step: the residual that step created is zeroed."""
    model, scaler = _model(), _scaler(64.0)
    comp = RandomBlock(ratio=0.1, named_parameters=model.named_parameters(), loss_scaler=scaler, **EVERY)
    _grads(model, 0, 64.0)
    for _, p in model.named_parameters():
        comp.decompress(*comp.compress(p.grad))
    scaler.update(new_scale=32.0)
    comp.state_dict()  # settles the rollback
    for state in comp.state.parameters.values():
        assert state.step == 0 and not state.residual.any() and state.loss_scale == 32.0


def test_a_checkpoint_remembers_the_scale_of_its_residuals():
    """Saved at scale 64, loaded under a scaler at 128 (another scaler state): the residual is
    doubled at the next compress, not taken as if in 128. Under a scaler at 32 it is halved and
    not rolled back: a restored state has no backup (state_dict settled it)."""
    model, scaler = _model(), _scaler(64.0)
    comp = RandomBlock(ratio=0.1, named_parameters=model.named_parameters(), loss_scaler=scaler, **EVERY)
    _grads(model, 0, 64.0)
    for _, p in model.named_parameters():
        comp.decompress(*comp.compress(p.grad))
    saved = comp.state_dict()
    assert {entry["loss_scale"] for entry in saved["parameters"].values()} == {64.0}
    residual = saved["parameters"]["0.weight"]["residual"].clone()
    for scale in (128.0, 32.0):
        other = _scaler(scale)
        resumed = RandomBlock(ratio=0.1, named_parameters=model.named_parameters(), loss_scaler=other, **EVERY)
        resumed.load_state_dict(saved)
        state = resumed.state.parameters["0.weight"]
        assert state.loss_scale == 64.0 and not state.backed_up
        LossScaling.follow(state, other.get_scale())
        assert torch.equal(state.residual, residual * (scale / 64.0)) and state.step == 1
        assert state.loss_scale == scale
