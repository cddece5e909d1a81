"""Elastic Horovod: a compressor's state alongside a Horovod elastic state
(``hvd.elastic.TensorFlowKerasState``, ``TensorFlowState``, or for Keras 3
sparsecomm.tensorflow.keras's state).

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, batch=0)
    sparsecomm.tensorflow.elastic.track(state, compression)

    @sparsecomm.tensorflow.elastic.run   # in place of @hvd.elastic.run, see `run`
    def train(state): ...

Without `track`, a compressor still notices a reset made by `run` (or, under
``hvd.elastic.run``, a new number of ranks) when compress is traced again, and every rank
then adopts rank 0's steps (sparsecomm.core.agreement). Horovod's TF
states have no handler registry, and their keyword arguments are broadcast from rank 0 as
plain objects (residuals differ per rank), so `track` chains each compressor to the state's
own commit, restore and sync, which adds:

- commit (save): a copy of this rank's steps, residuals, momenta and counters;
- restore (after a failure): that copy is assigned back, so residuals roll back with the model;
- sync (after every reset but a shrink): the next trace adopts rank 0's steps even when the
  number of ranks did not change (a worker replaced). Survivors keep their residuals; a
  joining rank starts from zero; a removed rank's residual is lost;
- on any reset the next trace of compress checks the settings again and measures the network
  again, collectively. A step traced before the reset refuses to run (its ranks are stale):
  create the tf.function inside the function decorated by ``hvd.elastic.run``, so each reset
  traces it anew.
"""

import contextlib
import os


@contextlib.contextmanager
def failed_collectives_as_resets():
    """Raises a tf.errors.UnknownError that mentions Horovod or a sparsecomm collective as
    HorovodInternalError, the error Horovod's elastic loop resets on; every other error as it is."""
    import tensorflow as tf
    from horovod.common.exceptions import HorovodInternalError

    try:
        yield
    except tf.errors.UnknownError as error:
        if "Horovod" in error.message or "sparsecomm." in error.message:
            raise HorovodInternalError(error) from error
        raise


def run(func):
    """``hvd.elastic.run`` for TensorFlow, recognising a failed collective wherever it is.

    Horovod 0.28.1's TF wrapper turns a graph error into a reset only when the message names
    one of its own op types (HorovodAllreduce, HorovodAllgather, HorovodBroadcast); any other
    tf.errors.UnknownError it swallows, and the wrapped function returns None as if training
    had ended. A failure inside a sparsecomm exchange (an alltoall, or collectives named after
    the parameter) is such an error. Here every UnknownError that mentions Horovod or a
    sparsecomm collective becomes a reset, and every other error is raised."""
    import functools

    import horovod.tensorflow as hvd
    from horovod.common.elastic import run_fn

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        with failed_collectives_as_resets():
            return func(state, *args, **kwargs)

    def reset():
        global _resets
        hvd.shutdown()
        hvd.init()
        _resets += 1

    return run_fn(wrapper, reset)


_resets = 0  # resets made by `run` in this process


def resets():
    """How many resets `run` made in this process: a compressor that saw fewer checks its settings
    and adopts rank 0's steps at its next trace, even when the number of ranks did not change."""
    return _resets


def track(state, *compressors):
    """Chains `compressors` (sparsecomm.tensorflow compressors) to a Horovod elastic state's
    save, restore and sync; returns the state."""
    from .compression import Compressor

    for compressor in compressors:
        if not isinstance(compressor, Compressor):
            raise TypeError(
                f"track: compressors should be sparsecomm.tensorflow compressors, got {type(compressor).__name__}"
            )
    if not all(hasattr(state, method) for method in ("save", "restore", "sync")):
        raise TypeError(
            f"track: state should be a Horovod elastic state (hvd.elastic.TensorFlowKerasState or "
            f"TensorFlowState), got {type(state).__name__}"
        )
    snapshots = {}
    save, restore, sync = state.save, state.restore, state.sync

    def save_all():
        save()
        snapshots.update({id(c): c.elastic_snapshot() for c in compressors})

    def restore_all():
        restore()
        for c in compressors:
            c.elastic_restore(snapshots[id(c)])

    def sync_all():
        sync()
        for c in compressors:
            c.elastic_sync()

    state.save, state.restore, state.sync = save_all, restore_all, sync_all
    snapshots.update({id(c): c.elastic_snapshot() for c in compressors})
    return state


def checked_ranks(owner, ranks, process_set, tensor, finish):
    """(tensor, finish), where under elastic Horovod a step traced for `ranks` ranks raises when the
    job has another number, instead of exchanging wrongly (routes, layouts and scales are fixed
    when compress is traced)."""
    if not int(os.environ.get("HOROVOD_ELASTIC", 0)):
        return tensor, finish
    import tensorflow as tf

    from . import exchange

    now = exchange.horovod().size_op(process_set_id=process_set.process_set_id)
    check = tf.debugging.assert_equal(
        now,
        ranks,
        message=f"{owner}: this step was traced for {ranks} ranks and the job now has a different "
        f"number (elastic Horovod): create the tf.function inside the function decorated by "
        f"hvd.elastic.run, so that each reset traces it again",
    )
    with tf.control_dependencies([check]):
        return tf.identity(tensor), finish
