"""sparsecomm.tensorflow compressors in one process (no Horovod collectives): argument and
input errors, attribution of gradients to variables, unnamed variables and Keras variables
with repeated names, the per-layer policy, the warm-up schedule, checkpoint layout, and
RandomBlock's compress/decompress against the reference.
The exchange itself is tested under horovodrun (test_multirank_tf_*.py)."""

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
import reference  # noqa: E402
from common import EVERY  # noqa: E402

from sparsecomm.tensorflow import DGC, RandomBlock, RandomK, RTopK, Threshold, TopK  # noqa: E402
from sparsecomm.tensorflow.state import VariableBinding  # noqa: E402


def _named(*shapes, dtype=tf.float32):
    return [(f"v{i}", tf.Variable(tf.zeros(shape, dtype))) for i, shape in enumerate(shapes)]


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: TopK(ratio=0), r"TopK: ratio should be a number in \(0, 1\], got 0"),
        (lambda: TopK(ratio=0.1, error_feedback="yes"), r"TopK: error_feedback should be True or False"),
        (lambda: RandomK(ratio=2), r"RandomK: ratio should be a number in \(0, 1\], got 2"),
        (lambda: RandomBlock(ratio=0.1, seed=-3), r"RandomBlock: seed should be an integer in \[0, 2\*\*64\), got -3"),
        (lambda: RTopK(ratio=0.1, r=0.05), r"RTopK: r should be at least ratio=0.1, got 0.05"),
        (
            lambda: Threshold(quantize="3bit"),
            r"Threshold: quantize should be one of None, 'fp16', 'bf16', '1bit', "
            r"'2bit', got '3bit'",
        ),
        (lambda: DGC(momentum=1.0), r"DGC: momentum should be a number in \[0, 1\), got 1.0"),
        (lambda: DGC(clip_norm=0), r"DGC: clip_norm should be None or a positive number, got 0"),
        (lambda: DGC(warmup_stages=0), r"DGC: warmup_stages should be an integer >= 1, got 0"),
        (lambda: TopK(ratio=0.1, min_numel=-1), r"TopK: min_numel should be an integer >= 0, got -1"),
        (lambda: TopK(ratio=0.1, dense="*.bias"), r"TopK: dense should be a list of name patterns"),
        (lambda: TopK(ratio=0.1, variables=[]), r"TopK: variables is empty \(build the model"),
        (lambda: TopK(ratio=0.1, variables=tf.keras.Sequential()), r"TopK: variables should be a list of variables"),
        (
            lambda: TopK(ratio=0.1, variables=[("w", tf.Variable(1.0)), ("w", tf.Variable(2.0))]),
            r"TopK: two \(name, variable\) pairs are named 'w'; names given in pairs should be unique",
        ),
        (
            lambda: (lambda w: TopK(ratio=0.1, variables=[w, tf.Variable(2.0), w]))(tf.Variable(1.0, name="w")),
            r"TopK: the variable 'w' is listed twice",
        ),
        (lambda: TopK(ratio=0.1, variables=[("a", 3)]), r"TopK: variables should hold TF/Keras variables"),
    ],
)
def test_bad_settings_are_named(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_bad_gradients_are_named():
    comp = RandomBlock(ratio=0.1, variables=_named((10, 10)), **EVERY)
    with pytest.raises(TypeError, match="RandomBlock: gradients should be float32, float16 or bfloat16, got int32"):
        comp.compress(tf.zeros([10, 10], tf.int32))
    with pytest.raises(TypeError, match="got tf.IndexedSlices; Horovod gathers those without compression"):
        comp.compress(tf.IndexedSlices(tf.zeros([2, 10]), tf.constant([0, 1]), tf.constant([10, 10])))
    with pytest.raises(
        LookupError,
        match=r"RandomBlock: got a gradient of shape \(3, 3\) and dtype float32 that "
        r"fits none of the bound variables \(v0 \(10, 10\) float32\)",
    ):
        comp.compress(tf.zeros([3, 3]))
    with pytest.raises(RuntimeError, match=r"TopK keeps per-variable state and needs variables="):
        TopK(ratio=0.1).compress(tf.zeros([4]))


class _HugeVariable:
    """What a compressor binds of a variable of 2**31 elements (one more than int32 indices
    address), without its 8 GB."""

    shape, dtype = tf.TensorShape([2**16, 2**15]), tf.float32

    def assign(self, value):
        raise AssertionError("not assigned")


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        (TopK, dict(ratio=0.01)),
        (RandomK, dict(ratio=0.01)),
        (Threshold, dict(ratio=0.01, quantize="1bit")),
        (DGC, dict(ratio=0.3, warmup_steps=10, warmup_stages=1)),  # dense at warm-up stage 0, sparse after
    ],
    ids=["TopK", "RandomK", "Threshold", "DGC-dense-first-stage"],
)
def test_a_variable_beyond_int32_indices_is_refused_when_bound(cls, kwargs):
    """Before its residual is allocated and before any trace or collective."""
    with pytest.raises(
        ValueError,
        match=(
            rf"^{cls.__name__}: 'embedding' has 2147483648 elements, more than 2147483647 \(2\*\*31 - 1\), "
            rf"the most that int32 indices can address, so it cannot be sent sparse. "
            rf"List it in dense=\['embedding'\] to send it dense through Horovod's allreduce, "
            rf"or split the parameter into tensors of at most 2147483647 elements.$"
        ),
    ):
        cls(variables=[("embedding", _HugeVariable())], **kwargs)


@pytest.mark.parametrize(
    "make",
    [
        lambda variables: TopK(ratio=0.01, variables=variables, dense=["embed*"]),
        lambda variables: RandomK(ratio=0.01, variables=variables, min_numel=2**32),
        lambda variables: TopK(ratio=0.7, variables=variables),  # the dense fallback: sparse would be larger
    ],
    ids=["dense=", "min_numel", "dense-fallback"],
)
def test_a_variable_beyond_int32_indices_routed_dense_traces_to_horovod_untouched(make):
    comp = make([("embedding", _HugeVariable())])
    assert comp.state[0].residual is None  # no 8 GB residual for a tensor that always goes dense

    @tf.function
    def reduce(grad):
        handed, ctx = comp.compress(grad)
        return handed, comp.decompress(handed, ctx)

    graph = reduce.get_concrete_function(tf.TensorSpec([2**16, 2**15], tf.float32)).graph  # traced, never run
    handed, decompressed = graph.structured_outputs
    assert handed.shape == decompressed.shape == [2**16, 2**15]
    assert not any(op.type.startswith("Sparsecomm") for op in graph.get_operations())


def test_gradients_are_attributed_in_order_skipping_missing_ones():
    binding = VariableBinding("T", _named((4, 3), (3,), (4, 3), (2,)))
    grads = [tf.zeros([4, 3]), tf.zeros([2]), tf.zeros([4, 3])]  # v1's gradient is None: skipped by shape
    assert [binding.attribute(g) for g in grads] == [0, 3, 2]
    assert binding.attribute(tf.zeros([4, 3])) == 0  # every variable had its turn: a new round (eager)

    @tf.function
    def trace(a, b):
        return tf.constant([binding.attribute(a), binding.attribute(b)])

    # each trace is a round of its own, whatever the eager calls did before
    assert trace(tf.zeros([4, 3]), tf.zeros([3])).numpy().tolist() == [0, 1]
    assert trace.get_concrete_function(tf.TensorSpec([4, 3]), tf.TensorSpec([2])) is not None
    with binding.expect(binding.variables[2]):
        assert binding.attribute(tf.zeros([4, 3])) == 2
        with pytest.raises(ValueError, match=r"the gradient of 'v2' should have shape \(4, 3\)"):
            binding.attribute(tf.zeros([3]))


def _train_eagerly(comp, variables, loss_fn, steps):
    """SGD steps, each gradient through compress and decompress in the order of `variables`
    (one process: only the shared-coordinate methods need no collective)."""
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = loss_fn()
        for v, g in zip(variables, tape.gradient(loss, variables)):
            v.assign_sub(0.1 * comp.decompress(*comp.compress(g)))


def test_plain_unnamed_variables_are_bound_with_unique_display_names():
    """TF names every unnamed variable "Variable". Repeats are shown, and key their random
    streams, as name_1, name_2, ... in binding order; names given in pairs stay as they are."""
    ws = [tf.Variable(tf.ones([8, 8])) for _ in range(3)] + [tf.Variable(tf.ones([8]), name="Variable_1")]
    comp = RandomK(ratio=0.25, seed=3, variables=ws, **EVERY)
    names = ["Variable", "Variable_1", "Variable_2", "Variable_1_1"]
    assert [state.variable_name for state in comp.state] == names
    assert [state.tensor_id for state in comp.state] == [reference.tensor_id(n) for n in names]
    _train_eagerly(comp, ws, lambda: tf.reduce_sum(ws[0] * ws[1] * ws[2]) + tf.reduce_sum(ws[3] ** 2), steps=2)
    stats = comp.stats()["tensors"]
    assert list(stats) == names and [t["calls"] for t in stats.values()] == [2, 2, 2, 2]
    # the same gradient for two variables of the same shape: their own streams pick different coordinates
    sent = [comp.decompress(*comp.compress(tf.ones([8, 8]))).numpy() != 0 for _ in range(3)]
    assert not (sent[0] == sent[1]).all() and not (sent[1] == sent[2]).all()
    assert VariableBinding("T", [tf.Variable(1.0), ("Variable", tf.Variable(2.0))]).names == ["Variable_1", "Variable"]


def test_keras_variables_with_repeated_names_train_and_show_unique_names():
    keras = pytest.importorskip("keras")

    class TwoKernels(keras.layers.Layer):  # two weights both named "kernel"
        def build(self, shape):
            self.a, self.b = (self.add_weight(name="kernel", shape=(16, 16)) for _ in range(2))

        def call(self, x):
            return x @ self.a @ self.b

    twins = [keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, name="same")], name="twin") for _ in range(2)]
    layer = TwoKernels(name="two")
    layer(tf.zeros([1, 16]))
    variables = twins[0].trainable_variables + twins[1].trainable_variables + layer.trainable_variables
    comp = RandomBlock(ratio=0.5, variables=variables, **EVERY)
    x = tf.constant(np.random.default_rng(0).standard_normal((4, 16)), tf.float32)
    _train_eagerly(comp, variables, lambda: tf.reduce_sum(layer(twins[1](twins[0](x))) ** 2), steps=3)
    stats = comp.stats()["tensors"]
    assert list(stats) == [
        "twin/same/kernel",
        "twin/same/bias",
        "twin/same/kernel_1",
        "twin/same/bias_1",
        "two/kernel",
        "two/kernel_1",
    ]
    assert all(t["calls"] == 3 and t["sent_elements"] > 0 for t in stats.values()), stats


def test_the_default_policy_and_the_dense_fallback():
    named = [
        ("big", tf.Variable(tf.zeros([64, 32]))),
        ("bias", tf.Variable(tf.zeros([2048]))),
        ("small", tf.Variable(tf.zeros([10, 10]))),
        ("emb.weight", tf.Variable(tf.zeros([64, 64]))),
        ("w16", tf.Variable(tf.zeros([100, 100], tf.float16))),
    ]
    comp = TopK(ratio=0.1, variables=named, dense=["emb.*"])
    assert [comp.goes_dense(n, v) for n, v in named] == [False, True, True, True, False]
    assert TopK(ratio=0.5, variables=named).goes_dense("w16", named[4][1])  # 16-bit values + 16-bit offsets
    assert not TopK(ratio=0.49, variables=named).goes_dense("w16", named[4][1])
    assert not RandomK(ratio=1.0, variables=named).goes_dense("big", named[0][1])


def test_dgc_warmup_schedule_matches_torch():
    dgc = DGC(ratio=0.001, warmup_steps=400, warmup_stages=4)
    sparsity = [round(1 - dgc.density(step), 4) for step in (0, 100, 200, 300, 400, 10_000)]
    assert sparsity == [0.7488, 0.9369, 0.9842, 0.996, 0.999, 0.999]
    assert [round(d, 6) for d in dgc.method.densities()] == [0.251189, 0.063096, 0.015849, 0.003981, 0.001]


def test_random_block_compress_decompress_equals_reference_across_a_retrace():
    """Eager and two tf.function traces share the state variables: the step and residual carry on."""
    named = _named((30, 40), dtype=tf.float16)
    comp = RandomBlock(ratio=0.1, seed=9, variables=named, **EVERY)
    traced = tf.function(lambda g: comp.decompress(*comp.compress(g)))
    residual = torch.zeros(1200)
    for step in range(6):
        grad = np.random.default_rng(step).standard_normal((30, 40)).astype(np.float16)
        run = (lambda g: comp.decompress(*comp.compress(g))) if step % 3 == 0 else traced
        got = run(tf.constant(grad)).numpy()
        start = reference.block_start(9, reference.tensor_id("v0"), step, 1200)
        values, residual = reference.random_block_pack(torch.from_numpy(grad), residual, start, 120)
        want = reference.random_block_unpack(values, 1200, start).numpy().reshape(30, 40)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(comp.state[0].residual.numpy(), residual.numpy())
    assert int(comp.state[0].step.numpy()) == 6 and comp.stats()["tensors"]["v0"]["sent_elements"] == 6 * 120


def test_state_is_checkpointed_by_position_and_restored(tmp_path):
    named = _named((40, 40), (40,))
    comp = DGC(ratio=0.1, variables=named, **EVERY)
    comp.state[0].residual.assign(tf.fill([1600], 2.5))
    comp.state[1].step.assign(7)
    path = tf.train.Checkpoint(compression=comp).save(str(tmp_path / "c"))
    keys = {name for name, _ in tf.train.list_variables(path)}
    assert "compression/state/0/residual/.ATTRIBUTES/VARIABLE_VALUE" in keys
    assert "compression/state/1/momentum/.ATTRIBUTES/VARIABLE_VALUE" in keys
    fresh = DGC(ratio=0.1, variables=named, **EVERY)
    tf.train.Checkpoint(compression=fresh).restore(path).assert_consumed()
    assert float(fresh.state[0].residual.numpy()[5]) == 2.5 and int(fresh.state[1].step.numpy()) == 7


def test_state_of_variables_with_one_name_is_checkpointed_by_position(tmp_path):
    def bound():
        return DGC(ratio=0.1, variables=[tf.Variable(tf.zeros([40, 40])) for _ in range(3)], **EVERY)

    comp = bound()
    for i, state in enumerate(comp.state):
        state.residual.assign(tf.fill([1600], float(i + 1)))
        state.step.assign(10 + i)
    path = tf.train.Checkpoint(compression=comp).save(str(tmp_path / "c"))
    keys = {name for name, _ in tf.train.list_variables(path)}
    assert {f"compression/state/{i}/residual/.ATTRIBUTES/VARIABLE_VALUE" for i in range(3)} <= keys
    fresh = bound()
    tf.train.Checkpoint(compression=fresh).restore(path).assert_consumed()
    assert [float(s.residual.numpy()[7]) for s in fresh.state] == [1.0, 2.0, 3.0]
    assert [int(s.step.numpy()) for s in fresh.state] == [10, 11, 12]


def test_settings_text_lists_the_public_settings():
    text = Threshold(ratio=0.05, quantize="2bit").settings()
    assert text.startswith("Threshold(") and "quantize='2bit'" in text and "ratio=0.05" in text
