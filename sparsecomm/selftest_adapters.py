"""The self-test's view of each framework's ops: numpy arrays in, numpy arrays out, state
returned rather than updated in place, so one set of checks covers torch and TensorFlow."""

import numpy as np


class TorchOps:
    framework = "torch"

    def __init__(self, device):
        import torch

        from .torch import ops

        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        self.torch, self.ops, self.device = torch, ops, device

    def _t(self, array):
        return self.torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    @staticmethod
    def _np(tensor):
        return tensor.cpu().numpy()

    def random_block_start(self, seed, tensor_id, step, numel):
        return self.ops.random_block_start(seed, tensor_id, step, numel)

    def block_pack(self, grad, residual, start, length):
        state = self._t(residual)
        values = self.ops.block_pack(self._t(grad), state, start, length)
        return self._np(values), self._np(state)

    def accumulate_candidates(self, grad, residual, threshold):
        state = self._t(residual)
        threshold = self.torch.tensor(threshold, device=self.device)
        acc, index = self.ops.accumulate_candidates(self._t(grad), state, threshold)
        return self._np(acc), self._np(index), self._np(state)

    def select_top(self, acc, index, k):
        values, chosen = self.ops.select_top(self._t(acc), self._t(index), k)
        return self._np(values), self._np(chosen)

    def sparse_unpack(self, values, index, numel, scale):
        return self._np(self.ops.sparse_unpack(self._t(values), self._t(index), numel, scale))

    def random_k_indices(self, k, step):
        like = self.torch.empty(10_000, device=self.device)
        return self._np(self.ops.random_k_indices(like, k, seed=1, tensor_id=2, step=step))

    def sum_of_squares(self, x):
        return float(self.ops.sum_of_squares(self._t(x)))


class TensorFlowOps:
    framework = "tensorflow"

    def __init__(self, device):
        import tensorflow as tf

        from .tensorflow import ops

        if device == "cuda" and not tf.config.list_physical_devices("GPU"):
            raise RuntimeError("TensorFlow sees no GPU")
        self.tf, self.ops, self.place = tf, ops, "/GPU:0" if device == "cuda" else "/CPU:0"

    def _call(self, function, *args, **kwargs):
        with self.tf.device(self.place):
            result = function(*args, **kwargs)
        return result

    def random_block_start(self, seed, tensor_id, step, numel):
        return int(self._call(self.ops.random_block_start, seed, tensor_id, step, numel))

    def block_pack(self, grad, residual, start, length):
        values, state = self._call(self.ops.block_pack, grad, residual, start, length)
        return values.numpy(), state.numpy()

    def accumulate_candidates(self, grad, residual, threshold):
        acc, index, state, _ = self._call(self.ops.accumulate_candidates, grad, residual, threshold)
        return acc.numpy(), index.numpy(), state.numpy()

    def select_top(self, acc, index, k):
        values, chosen = self._call(self.ops.select_top, acc, index, k)
        return values.numpy(), chosen.numpy()

    def sparse_unpack(self, values, index, numel, scale):
        return self._call(self.ops.sparse_unpack, values, index, numel, scale).numpy()

    def random_k_indices(self, k, step):
        return self._call(self.ops.random_k_indices, 10_000, k, seed=1, tensor_id=2, step=step).numpy()

    def sum_of_squares(self, x):
        return float(self._call(self.ops.sum_of_squares, x))


def for_framework(framework, device):
    return {"torch": TorchOps, "tensorflow": TensorFlowOps}[framework](device)
