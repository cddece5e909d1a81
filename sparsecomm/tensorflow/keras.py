"""Keras 3 training with Horovod and sparsecomm, where ``horovod.tensorflow.keras`` fails.

TF >= 2.16's ``tf.keras`` is Keras 3, and Horovod 0.28.1's Keras layer does not work with
it (its broadcast callback and optimizer wrapper expect Keras 2 objects). For Keras 3,
``model.fit`` works with:

    import horovod.tensorflow as hvd
    import keras
    import sparsecomm.tensorflow as sctf
    from sparsecomm.tensorflow import keras as sckeras

    hvd.init()
    model = ...                                              # built (e.g. keras.Input first)
    compression = sctf.DGC(ratio=0.01, variables=model.trainable_variables)
    model.compile(optimizer=sckeras.DistributedOptimizer(keras.optimizers.SGD(0.1), compression),
                  loss=..., jit_compile=False)                # Horovod's ops have no XLA kernels
    model.fit(x, y, callbacks=[sckeras.BroadcastInitialVariables(root_rank=0)])

Elastic Horovod (Keras 3): ``ElasticState(model, optimizer, compression, batch=0)`` with
``sparsecomm.tensorflow.elastic.run`` (sparsecomm/tensorflow/keras_elastic.py).

With tf-keras (``TF_USE_LEGACY_KERAS=1``), use Horovod's own
``horovod.tensorflow.keras.DistributedOptimizer(opt, compression=compression)``: the
compressors work there as they are.
"""

import keras
import tensorflow as tf

from .. import prerequisites
from .compression import Compressor


def _hvd():
    return prerequisites.horovod("tensorflow")


def _reduce(grads, variables, compression, op, process_set):
    """Each dense gradient through hvd.allreduce with the compressor, which is told the
    variable (exact attribution); IndexedSlices go through Horovod's allgather."""
    hvd = _hvd()
    binding = getattr(compression, "_binding", None)
    reduced = []
    for i, (grad, variable) in enumerate(zip(grads, variables)):
        if grad is None:
            reduced.append(None)
            continue
        name = f"sparsecomm.keras.grad_{i}"
        if binding is not None and not isinstance(grad, tf.IndexedSlices):
            with binding.expect(variable):
                reduced.append(hvd.allreduce(grad, op=op, compression=compression, name=name, process_set=process_set))
        else:
            reduced.append(
                hvd.allreduce(
                    grad, op=op, compression=compression or hvd.Compression.none, name=name, process_set=process_set
                )
            )
    return reduced


def DistributedOptimizer(optimizer, compression=None, op=None, process_set=None):
    """A Keras 3 optimizer that averages (or sums: ``op=hvd.Sum``) the gradients over the
    Horovod ranks, through `compression` (a sparsecomm.tensorflow compressor bound to the
    model's trainable variables; None: dense), before applying them.

    Returns a new optimizer of a subclass of ``type(optimizer)`` built from its config. Mixed
    precision: pass a ``keras.optimizers.LossScaleOptimizer``; a compressor whose
    ``loss_scaler`` is that optimizer follows the returned one's scale instead."""
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"DistributedOptimizer: optimizer should be a Keras 3 optimizer (keras.optimizers.*), got "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}; with tf-keras use "
            f"horovod.tensorflow.keras.DistributedOptimizer"
        )
    hvd = _hvd()
    op = hvd.Average if op is None else op
    process_set = process_set or hvd.global_process_set
    base = type(optimizer)

    def apply(self, grads, trainable_variables=None):
        if not self.built:  # a LossScaleOptimizer's scale variable is read while reducing
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        variables = list(trainable_variables) if trainable_variables is not None else self._trainable_variables
        grads = _reduce(list(grads), variables, compression, op, process_set)
        return base.apply(self, grads, trainable_variables)

    distributed = type(base.__name__, (base,), {"apply": apply, "__module__": base.__module__})
    instance = distributed.from_config(optimizer.get_config())
    if isinstance(compression, Compressor):  # the scale the new optimizer multiplies the loss by
        compression.replace_loss_scaler(optimizer, instance)
    return instance


def broadcast_variables(variables, root_rank=0, process_set=None):
    """Sets every rank's variables (Keras 3 or TF) to root_rank's values (eager)."""
    hvd = _hvd()
    process_set = process_set or hvd.global_process_set
    for i, variable in enumerate(variables):
        value = tf.convert_to_tensor(variable)
        variable.assign(hvd.broadcast(value, root_rank, name=f"sparsecomm.broadcast.{i}", process_set=process_set))


class BroadcastInitialVariables(keras.callbacks.Callback):
    """Broadcasts the model's variables (and the optimizer's, once built) from root_rank
    when training begins, so every rank starts from the same weights."""

    def __init__(self, root_rank=0, process_set=None):
        super().__init__()
        self.root_rank, self.process_set = root_rank, process_set

    def on_train_begin(self, logs=None):
        variables = list(self.model.variables)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and optimizer.built:
            variables += list(optimizer.variables)
        broadcast_variables(variables, self.root_rank, self.process_set)


def __getattr__(name):
    """``ElasticState`` (sparsecomm/tensorflow/keras_elastic.py), imported on first use: it
    subclasses Horovod's ObjectState, and this module imports without Horovod."""
    if name == "ElasticState":
        from .keras_elastic import ElasticState

        return ElasticState
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
