"""Elastic Horovod for Keras 3: `ElasticState`, re-exported as ``sparsecomm.tensorflow.keras.ElasticState``.

Horovod 0.28.1's own TF states fail with Keras 3 (TF >= 2.16's default Keras):

- ``hvd.elastic.TensorFlowKerasState`` calls ``optimizer.variables()``; a Keras 3 optimizer's
  ``variables`` is a list property (TypeError: 'list' object is not callable).
- ``hvd.elastic.TensorFlowState`` broadcasts its variables in its constructor under TF2, a
  collective only a joining rank starts (the joiner hangs), and the broadcast passes the
  variables into a tf.function, where Keras 3 variables become tensors (AttributeError:
  'SymbolicTensor' object has no attribute 'assign').

Here every collective runs eagerly in `sync`, one ``hvd.broadcast`` per variable. Horovod's eager
TF collectives ignore ``name=`` and pair up by call order (checked on 2 ranks: two allgathers
named "a" and "b", called in opposite orders, swapped their data), so `sync` first checks
that every rank holds the same list of variable shapes and dtypes.
"""

import keras
import tensorflow as tf

from .. import prerequisites
from . import elastic
from .compression import Compressor
from .keras import broadcast_variables

hvd = prerequisites.horovod("tensorflow")
from horovod.common.elastic import ObjectState  # noqa: E402  (after the check that Horovod imports)

_OWN = ("model", "optimizer", "compressors")


class ElasticState(ObjectState):
    """The elastic state of a Keras 3 model, its Keras 3 optimizer and sparsecomm compressors,
    for ``sparsecomm.tensorflow.elastic.run`` (or ``hvd.elastic.run``):

        state = sckeras.ElasticState(model, optimizer, compression, epoch=0, batch=0)

    - `model`: a built Keras 3 model (or layer); `optimizer`: a Keras 3 optimizer (None: the
      compiled ``model.optimizer``), built here against ``model.trainable_variables`` if it is
      not yet (locally; the constructor runs no collective); `compression`: None, one
      sparsecomm.tensorflow compressor or a list of them; keyword arguments: plain Python
      values, attributes of the state, committed and broadcast from rank 0 (Horovod's ObjectState).
    - save (``state.commit()``): a host copy of the model's variables, the optimizer's
      (``iterations`` and the slots included) and each compressor's ``elastic_snapshot()``.
    - restore (after a failed collective): those copies assigned back, compressors through
      ``elastic_restore``.
    - sync (at the start and after every reset but a shrink by discovery; collective, eager):
      the optimizer is built if it is not, the ranks check that they hold the same variable
      list, every variable takes rank 0's value, every compressor's ``elastic_sync()`` runs (its
      next compress checks the settings and adopts rank 0's steps), the keyword arguments take
      rank 0's values, and the result is saved. A rank failing meanwhile is a reset, as in
      ``sparsecomm.tensorflow.elastic.run``.
    """

    def __init__(self, model, optimizer=None, compression=None, **kwargs):
        self.model = _checked_model(model)
        self.optimizer = _checked_optimizer(optimizer, model)
        self.compressors = _checked_compressors(compression)
        clashes = sorted(k for k in kwargs if k in _OWN or k.startswith("_") or hasattr(type(self), k))
        if clashes:
            raise ValueError(
                f"ElasticState: keyword arguments {clashes} would hide the state's own attributes or "
                f"methods; name them otherwise"
            )
        _build(self.optimizer, self.model)  # the snapshot below then holds every optimizer variable
        self._save_variables()
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **kwargs)

    def variables(self):
        """What save, restore and sync copy: the model's variables, then the optimizer's."""
        return list(self.model.variables) + list(self.optimizer.variables)

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        variables = self.variables()
        if len(variables) != len(self._saved_values):
            raise RuntimeError(
                f"ElasticState.restore: the model and optimizer now hold {len(variables)} variables, "
                f"the last commit {len(self._saved_values)}; do not add variables after the state "
                f"is made"
            )
        for variable, value in zip(variables, self._saved_values):
            variable.assign(value)
        for compressor, snapshot in zip(self.compressors, self._saved_compressors):
            compressor.elastic_restore(snapshot)
        super().restore()

    def sync(self):
        # Horovod's elastic loop resets only on a HorovodInternalError raised by sync itself.
        with elastic.failed_collectives_as_resets():
            _build(self.optimizer, self.model)
            variables = self.variables()
            _check_same_variables(variables)
            broadcast_variables(variables, root_rank=0)
            for compressor in self.compressors:
                compressor.elastic_sync()
            super().sync()
        self._save_variables()

    def _save_variables(self):
        self._saved_values = [variable.numpy().copy() for variable in self.variables()]
        self._saved_compressors = [compressor.elastic_snapshot() for compressor in self.compressors]


def _checked_model(model):
    if not isinstance(model, keras.layers.Layer):
        raise TypeError(
            f"ElasticState: model should be a Keras 3 model (keras.Model), got "
            f"{type(model).__module__}.{type(model).__name__}; with tf-keras use "
            f"hvd.elastic.TensorFlowKerasState and sparsecomm.tensorflow.elastic.track"
        )
    if not model.built or not model.variables:
        raise ValueError(
            f"ElasticState: model should be built (start it with keras.Input, or call "
            f"model.build(input_shape)), got {model.name!r} with no variables yet"
        )
    return model


def _checked_optimizer(optimizer, model):
    if optimizer is None:
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError(
                "ElasticState: optimizer is None and the model is not compiled with one: pass the Keras 3 optimizer"
            )
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"ElasticState: optimizer should be a Keras 3 optimizer (keras.optimizers.*, or "
            f"sparsecomm.tensorflow.keras.DistributedOptimizer(...)), got "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}"
        )
    return optimizer


def _checked_compressors(compression):
    single = not isinstance(compression, (list, tuple))
    compressors = [] if compression is None else [compression] if single else list(compression)
    for i, compressor in enumerate(compressors):
        if not isinstance(compressor, Compressor):
            where = "compression" if single else f"compression[{i}]"
            raise TypeError(
                f"ElasticState: {where} should be a sparsecomm.tensorflow compressor (DGC, TopK, ...), "
                f"got {type(compressor).__module__}.{type(compressor).__name__}"
            )
    if len({id(c) for c in compressors}) != len(compressors):
        raise ValueError("ElasticState: compression lists a compressor twice")
    return tuple(compressors)


def _build(optimizer, model):
    """As Keras 3's optimizer.apply builds it: so a joiner's optimizer, not yet applied, holds
    the same variables as the others'."""
    if not optimizer.built:
        with keras.name_scope(optimizer.name, caller=optimizer):
            optimizer.build(model.trainable_variables)
        optimizer.built = True


def _check_same_variables(variables):
    """Every rank holds the same shapes and dtypes (collective): the same error on every rank
    instead of mismatched broadcasts."""
    mine = [(getattr(v, "path", v.name), tuple(v.shape), tf.as_dtype(v.dtype).name) for v in variables]
    everyone = hvd.allgather_object(mine, name="sparsecomm.elastic.variables")
    for rank, theirs in enumerate(everyone):
        if [s[1:] for s in theirs] != [s[1:] for s in everyone[0]]:
            diff = next(
                (i for i, (a, b) in enumerate(zip(theirs, everyone[0])) if a[1:] != b[1:]),
                min(len(theirs), len(everyone[0])),
            )
            raise ValueError(
                f"ElasticState.sync: rank {rank}'s model and optimizer hold {len(theirs)} variables, "
                f"rank 0's {len(everyone[0])}; first difference at #{diff}: rank {rank} "
                f"{theirs[diff : diff + 1]}, rank 0 {everyone[0][diff : diff + 1]}"
            )
