"""Elastic Horovod: a compressor's state in ``hvd.elastic.TorchState``.

Horovod's recipe works as its docs write it:

    optimizer = hvd.DistributedOptimizer(sgd, named_parameters=..., compression=compression)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, batch=0)

The first compressor made registers two handlers in Horovod's elastic handler registry:
- a DistributedOptimizer that carries a sparsecomm compressor is handled as Horovod handles an
  optimizer, and its sync also tells the compressor of the reset: the next compress checks the
  settings and adopts rank 0's steps, collectively (sparsecomm.core.agreement);
- a compressor passed to the state itself (``compression=compression``) adds commit and
  rollback of its own state: commit copies this rank's steps, residuals, momenta and stats;
  restore (after a failure) loads that copy, so residuals roll back with the model.
A compressor is never pickled and broadcast as a plain object: residuals differ per rank.
Survivors keep their residuals; a joining rank starts from zero; a removed rank's residual is
lost. Without either handler, a new number of ranks is still noticed by the next compress.
"""

_registered = []


def register_handlers(compressor_class):
    """Adds the handlers for `compressor_class` to Horovod's elastic handler registry (once; a
    no-op without horovod.torch)."""
    if _registered:
        return
    try:
        from horovod.torch.elastic import state as hvd_state
    except ImportError:
        return

    class CompressorStateHandler(hvd_state.StateHandler):
        def __init__(self, compressor):
            super().__init__(compressor)
            self.save()

        def save(self):
            self._saved = self.value.elastic_snapshot()

        def restore(self):
            self.value.elastic_restore(self._saved)

        def sync(self):
            self.value.elastic_sync()

    class CompressingOptimizerHandler(hvd_state.OptimizerStateHandler):
        def sync(self):
            super().sync()
            self.value._compression.elastic_sync()

    class CarriesCompressor(type):
        # Horovod's DistributedOptimizer is a class made per optimizer type, so it is matched by
        # what it carries: the `_compression` it was given.
        def __instancecheck__(cls, value):
            return isinstance(getattr(value, "_compression", None), compressor_class)

    class CompressingOptimizer(metaclass=CarriesCompressor):
        pass

    # First: Horovod takes the first entry that matches, and the optimizer is also a torch Optimizer.
    hvd_state.set_handler_registry(
        [(CompressingOptimizer, CompressingOptimizerHandler)]
        + hvd_state.get_handler_registry()
        + [(compressor_class, CompressorStateHandler)]
    )
    _registered.append(CompressorStateHandler)
