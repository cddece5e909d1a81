"""Each compressor's constructor is declared once (sparsecomm.core.arguments): the torch and TF
classes take the same arguments in the same order (torch's named_parameters= is TF's
variables=), every argument reaches its taker (the method, the planner, the policy, the
compressor), their docstrings list every argument, and a wrong argument names itself."""

import inspect
import re

import pytest
import torch

import sparsecomm.torch as sct
from sparsecomm.core import arguments
from sparsecomm.core.cost import Network

METHODS = ("RandomBlock", "RandomK", "TopK", "RTopK", "Threshold", "DGC")
# Every argument of every method set to a value other than its default (what the core's Method
# and Planner keep is checked against these).
NOT_DEFAULT = {
    "ratio": 0.25,
    "seed": 7,
    "error_feedback": False,
    "r": 0.5,
    "quantize": "fp16",
    "sample_ratio": 0.05,
    "momentum": 0.5,
    "momentum_masking": False,
    "clip_norm": 2.0,
    "warmup_steps": 10,
    "warmup_stages": 2,
    "nesterov": True,
    "dense_fallback": False,
    "exchange": "allgather",
    "network": Network(bandwidth=1.25e8, latency=5e-5),
}


# The public signatures users call, written out (the released API: a reorder breaks positional calls).
_ROUTED = "dense_fallback=True, exchange='auto', network=None, loss_scaler=None, **policy"
SIGNATURES = {
    "RandomBlock": "ratio, seed=0, named_parameters=None, error_feedback=True, process_set=None, loss_scaler=None, "
    "**policy",
    "TopK": f"ratio, named_parameters=None, error_feedback=True, process_set=None, {_ROUTED}",
    "RTopK": f"ratio, r=None, seed=0, named_parameters=None, error_feedback=True, process_set=None, {_ROUTED}",
    "Threshold": "ratio=0.01, quantize=None, sample_ratio=0.01, named_parameters=None, error_feedback=True, "
    f"process_set=None, {_ROUTED}",
    "DGC": "ratio=0.001, momentum=0.9, momentum_masking=True, clip_norm=None, warmup_steps=0, warmup_stages=4, "
    f"sample_ratio=0.01, nesterov=False, named_parameters=None, process_set=None, {_ROUTED}",
}
SIGNATURES["RandomK"] = SIGNATURES["RandomBlock"]


@pytest.mark.parametrize("name", METHODS)
def test_the_signatures_are_the_released_ones(name):
    assert str(inspect.signature(getattr(sct, name))) == f"({SIGNATURES[name]})"
    tf_signature = str(inspect.signature(getattr(_tf(), name)))
    assert tf_signature == f"({SIGNATURES[name]})".replace("named_parameters=", "variables=")


def _tf():
    return pytest.importorskip("sparsecomm.tensorflow")


@pytest.mark.parametrize("name", METHODS)
def test_torch_and_tf_take_the_same_arguments_in_the_same_order(name):
    torch_names = list(inspect.signature(getattr(sct, name)).parameters)
    tf_names = list(inspect.signature(getattr(_tf(), name)).parameters)
    assert torch_names == [n if n != "variables" else "named_parameters" for n in tf_names]
    assert torch_names[0] == "ratio" and torch_names[-1] == "policy" and "named_parameters" in torch_names


@pytest.mark.parametrize("name", METHODS)
def test_every_argument_reaches_its_taker_by_position_and_by_keyword(name):
    cls = getattr(sct, name)
    params = [p for p in inspect.signature(cls).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    values = [NOT_DEFAULT.get(p.name, p.default) for p in params]
    by_position = cls(*values, min_numel=5, dense_1d=False)
    by_keyword = cls(**{p.name: v for p, v in zip(params, values)}, min_numel=5, dense_1d=False)
    for compressor in (by_position, by_keyword):
        kept = dict(compressor.method.settings(), **compressor.planner.settings(), **vars(compressor.policy))
        for p in params:
            if p.name in NOT_DEFAULT:
                assert kept[p.name] == NOT_DEFAULT[p.name], (name, p.name)
        assert (compressor.policy.min_numel, compressor.policy.dense_1d) == (5, False)
    assert by_position.settings() == by_keyword.settings()


@pytest.mark.parametrize("name", METHODS)
def test_the_docstrings_list_every_argument(name):
    for module in (sct, _tf()):
        cls = getattr(module, name)
        args = cls.__doc__.split("\n    Args:\n", 1)[1]
        listed = re.findall(r"^ {8}(\w+): ", args, re.M)
        assert listed == list(inspect.signature(cls).parameters), (module.__name__, name)


def test_a_wrong_argument_names_itself_and_what_the_class_takes():
    with pytest.raises(TypeError, match=r"^RandomK: unexpected argument 'exchange'; it takes ratio, seed, "):
        sct.RandomK(0.1, exchange="spardl")
    with pytest.raises(TypeError, match=r"^TopK: missing a required argument: 'ratio'"):
        sct.TopK()
    with pytest.raises(TypeError, match=r"^DGC: multiple values for argument 'ratio'"):
        sct.DGC(0.1, ratio=0.2)
    with pytest.raises(TypeError, match=r"^TopK: too many positional arguments"):
        sct.TopK(0.1, None, True, None, True, "auto", None, None, 1)


def test_a_users_subclass_keeps_its_parents_arguments_and_is_named_in_messages():
    class MyDGC(sct.DGC):
        pass

    assert inspect.signature(MyDGC) == inspect.signature(sct.DGC)
    with pytest.raises(ValueError, match=r"^MyDGC: ratio should be a number in \(0, 1\]"):
        MyDGC(ratio=2)
    model = torch.nn.Linear(4, 2)
    assert MyDGC(named_parameters=model.named_parameters()).bound_parameters() == ["weight", "bias"]


def test_a_new_method_is_one_entry():
    # what ORDER declares is what the classes take: nothing else spells the arguments out
    for name in METHODS:
        declared = [
            arguments.FRAMEWORK_BINDING["torch"] if n == arguments.BINDING else n for n, _ in arguments.ORDER[name]
        ]
        assert list(inspect.signature(getattr(sct, name)).parameters)[:-1] == declared
