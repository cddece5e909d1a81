"""Elastic Horovod: a compressor's state in ``hvd.elastic.TorchState``.

    state = hvd.elastic.TorchState(model, optimizer, compression=compression, batch=0)

Every sparsecomm compressor passed to TorchState is handled by `CompressorStateHandler`
(registered in Horovod's handler registry when the first compressor is made), not pickled
and broadcast as a plain object (residuals differ per rank):

- commit (save): a copy of this rank's steps, residuals, momenta and stats;
- restore (after a failure): that copy is loaded, so residuals roll back with the model;
- sync (after every reset but a shrink): the steps of rank 0 are adopted by every rank,
  so warm-up schedules and shared-seed coordinates agree again. Survivors keep their
  residuals; a joining rank starts from zero; a removed rank's residual is lost;
- on any reset the next compress checks the settings again and measures the network again
  (exchange="auto"), collectively, with every rank of the new world.
"""
_registered = []


def register_handler(compressor_class):
    """Adds `compressor_class` to Horovod's elastic handler registry (once; a no-op without
    horovod.torch)."""
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

    hvd_state.set_handler_registry(hvd_state.get_handler_registry() + [(compressor_class, CompressorStateHandler)])
    _registered.append(CompressorStateHandler)
