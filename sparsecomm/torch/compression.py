"""Horovod compressors for PyTorch.

Every compressor is an instance usable as ``hvd.DistributedOptimizer(...,
compression=...)``: Horovod calls ``compress(tensor) -> (tensor, ctx)`` on each gradient,
allreduces (sums, then scales for Average) what it returns, and sets the parameter's
gradient to ``decompress(output, ctx)``.
"""
import fnmatch
import itertools
import math
import time
from typing import Dict, Iterable, Optional, Tuple

import torch

from .. import _cost, _settings
from . import exchange, ops
from .state import ParameterBinding, ParameterState

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


_instances = itertools.count()  # names each compressor's settings check, in construction order (same on every rank)


class _BoundCompressor:
    """Shared plumbing: parameter binding, per-parameter state, the per-layer policy, argument
    checks, stats.

    Per-layer policy (every compressor): a parameter goes dense (Horovod's own allreduce,
    untouched) when it has fewer than ``min_numel`` elements, when it is 1-D and ``dense_1d``
    (biases, norm scales: the DGC paper compresses only tensors of dim > 1), or when its name
    matches one of the fnmatch patterns in ``dense`` (e.g. ``["*.embedding.*"]``).
    """

    def __init__(self, named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]], process_set=None,
                 min_numel: int = 1024, dense_1d: bool = True, dense: Iterable[str] = ()):
        self._name = type(self).__name__
        self._binding = None if named_parameters is None else ParameterBinding(self._name, named_parameters)
        self._states: Dict[str, ParameterState] = {}
        self._stats = {"calls": 0, "dense_bytes": 0, "sent_bytes": 0, "received_bytes": 0, "compress_seconds": 0.0}
        self._tensor_stats: Dict[str, dict] = {}
        if isinstance(min_numel, bool) or not isinstance(min_numel, int) or min_numel < 0:
            raise ValueError(f"{self._name}: min_numel should be an integer >= 0, got {min_numel!r}")
        _settings.check_flag(self._name, "dense_1d", dense_1d)
        if isinstance(dense, str) or not all(isinstance(pattern, str) for pattern in dense):
            raise TypeError(f"{self._name}: dense should be a list of name patterns, got {dense!r}")
        self.min_numel, self.dense_1d, self.dense = min_numel, dense_1d, tuple(dense)
        self.process_set = process_set  # the optimizer's (None: all ranks); the settings check runs over it
        self._instance = next(_instances)
        self._settings_checked = False

    def settings(self) -> str:
        """The settings every rank must share, as text (compared across ranks on the first step)."""
        public = {k: v for k, v in sorted(vars(self).items())
                  if not k.startswith("_") and isinstance(v, (bool, int, float, str, tuple, type(None), _cost.Network))}
        return f"{self._name}({', '.join(f'{k}={v!r}' for k, v in public.items())})"

    def _check_settings_across_ranks(self) -> None:
        """On the first compress: one blocking allgather of every rank's settings. Different
        settings raise the same error on every rank, instead of hanging or training wrong."""
        self._settings_checked = True
        hvd = exchange._hvd()
        process_set = self.process_set or hvd.global_process_set
        if not hvd.is_initialized() or process_set.size() == 1:
            return
        mine = torch.tensor(list(self.settings().encode("utf-8")), dtype=torch.uint8)
        name = f"sparsecomm.settings.{self._instance}"
        lengths = hvd.allgather(torch.tensor([mine.numel()]), name=f"{name}.length", process_set=process_set)
        texts = hvd.allgather(mine, name=f"{name}.text", process_set=process_set).split(lengths.tolist())
        settings = [bytes(t.tolist()).decode("utf-8") for t in texts]
        if len(set(settings)) > 1:
            listed = "; ".join(f"rank {r}: {text}" for r, text in enumerate(settings))
            raise ValueError(f"{self._name}: compressor settings differ across ranks ({listed}). "
                             f"Every rank must construct the compressor with the same arguments.")

    def goes_dense(self, name: str, tensor: torch.Tensor) -> bool:
        """Whether the per-layer policy sends this parameter's gradient dense."""
        return (tensor.numel() < self.min_numel or (self.dense_1d and tensor.dim() == 1)
                or any(fnmatch.fnmatchcase(name, pattern) for pattern in self.dense)
                or self._sparse_is_larger(name, tensor))

    def _sparse_is_larger(self, name: str, tensor: torch.Tensor) -> bool:
        """Shared-coordinate methods never send more than dense; the gathering ones override this."""
        return False

    def compress(self, tensor: torch.Tensor):
        """Horovod's hook: (what to allreduce, context for decompress)."""
        started = time.perf_counter()
        state = self._state_for(tensor)
        if not self._settings_checked:
            self._check_settings_across_ranks()
        if self.goes_dense(state.name, tensor):
            dense = exchange.to_wire(self._dense(tensor, state))
            size = tensor.numel() * dense.element_size()
            ranks = self._ranks()
            self._account(state, tensor, tensor.numel(), size, started, received_bytes=int(2 * (ranks - 1) / ranks * size))
            return dense, (None if dense.dtype == tensor.dtype else tensor.dtype)
        return self._compress(tensor, state, started)

    def _dense(self, tensor: torch.Tensor, state: ParameterState) -> torch.Tensor:
        """What a gradient the policy sends dense hands Horovod: itself (DGC: its momentum)."""
        return tensor

    def decompress(self, tensor: torch.Tensor, ctx) -> torch.Tensor:
        """Horovod's hook: the dense gradient from what the allreduce returned."""
        if ctx is None:
            return tensor
        return tensor.to(ctx) if isinstance(ctx, torch.dtype) else self._decompress(tensor, ctx)

    def _state_for(self, tensor: torch.Tensor) -> ParameterState:
        if self._binding is None:
            raise RuntimeError(
                f"{self._name} keeps per-parameter state and needs named_parameters=: construct it as "
                f"{self._name}(..., named_parameters=model.named_parameters())")
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in _FLOAT_DTYPES:
            got = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"{self._name}: gradients should be float32, float16 or bfloat16, got {got}")
        name = self._binding.name_of(tensor)
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = ParameterState(name, _settings.tensor_id(name))
        return state

    def _ranks(self) -> int:
        hvd = exchange._hvd()
        return (self.process_set or hvd.global_process_set).size() if hvd.is_initialized() else 1

    def _account(self, state: ParameterState, tensor: torch.Tensor, sent_elements: int, sent_bytes: int,
                 started: float, received_bytes: int = 0) -> None:
        seconds = time.perf_counter() - started
        dense_bytes = tensor.numel() * tensor.element_size()
        per = self._tensor_stats.setdefault(state.name, {"calls": 0, "numel": tensor.numel(), "sent_elements": 0,
                                                         "dense_bytes": 0, "sent_bytes": 0, "received_bytes": 0,
                                                         "compress_seconds": 0.0})
        for totals in (self._stats, per):
            totals["calls"] += 1
            totals["dense_bytes"] += dense_bytes
            totals["sent_bytes"] += sent_bytes
            totals["received_bytes"] += received_bytes
            totals["compress_seconds"] += seconds
        per["sent_elements"] += sent_elements

    def _account_later(self, name: str, sent_bytes: int, received_bytes: int) -> None:
        """Bytes known only in decompress (what the gathers brought, a second phase's payload)."""
        for totals in (self._stats, self._tensor_stats[name]):
            totals["sent_bytes"] += sent_bytes
            totals["received_bytes"] += received_bytes

    def _residual_of(self, state: ParameterState, tensor: torch.Tensor):
        """The parameter's float32 residual (created on first use), or None without error feedback."""
        if not self.error_feedback:
            return None
        if state.residual is None:
            state.residual = torch.zeros(tensor.numel(), dtype=torch.float32, device=tensor.device)
        return state.residual

    def state_dict(self) -> dict:
        """This rank's compressor state, for checkpoints (each rank saves its own: residuals
        differ per rank): per parameter, the step, residual and momentum."""
        return {"compressor": self._name,
                "parameters": {name: {"step": s.step, "residual": s.residual, "momentum": s.momentum}
                               for name, s in self._states.items()},
                "stats": dict(self._stats)}

    def load_state_dict(self, state: dict) -> None:
        """Restores a state_dict() so training continues exactly as if it had not stopped."""
        if not isinstance(state, dict) or "parameters" not in state:
            raise TypeError(f"{self._name}: load_state_dict expects what state_dict() returned, got "
                            f"{type(state).__name__}")
        if state.get("compressor") != self._name:
            raise ValueError(f"{self._name}: the state was saved by {state.get('compressor')!r}, not {self._name}")
        if self._binding is None:
            raise RuntimeError(f"{self._name}: bind named_parameters= before load_state_dict")
        states = {}
        for name, saved in state["parameters"].items():
            param = self._binding.params.get(name)
            if param is None:
                raise KeyError(f"{self._name}: the state has parameter {name!r}, which is not among named_parameters")
            restored = ParameterState(name, _settings.tensor_id(name), int(saved["step"]))
            for key in ("residual", "momentum"):
                tensor = saved.get(key)
                if tensor is not None and tensor.numel() != param.numel():
                    raise ValueError(f"{self._name}: the saved {key} of {name!r} has {tensor.numel()} elements, "
                                     f"the parameter {param.numel()}")
                setattr(restored, key, None if tensor is None else tensor.to(param.device, torch.float32).clone())
            states[name] = restored
        self._states = states
        self._stats.update(state.get("stats", {}))

    def stats(self) -> dict:
        """Since construction (cheap: counters updated in compress):
        calls, dense_bytes (what a dense allreduce would have been handed), sent_bytes (what this
        rank handed to Horovod: payload per rank, before the collectives' own traffic),
        received_bytes (what arrived from the other ranks: exact for gathers and alltoalls, the
        ring's 2 (N-1)/N of the tensor for a dense allreduce), compress_seconds (host time in
        compress), and per parameter under "tensors": the same plus numel, sent_elements,
        density (sent elements per call / numel; 1 when dense) and, for the gathering methods,
        the exchange chosen and the cost model's predicted seconds of each."""
        tensors = {name: dict(per, density=per["sent_elements"] / (per["calls"] * per["numel"]) if per["numel"] else 1.0,
                              **{k: v for k, v in getattr(self, "_choices", {}).get(name, {}).items() if k != "key"})
                   for name, per in self._tensor_stats.items()}
        return dict(self._stats, tensors=tensors)


class _SharedSeed(_BoundCompressor):
    """Compressors whose coordinates every rank draws alike from (seed, step, parameter name):
    the packed values ride Horovod's allreduce."""

    def __init__(self, ratio: float, seed: int = 0, named_parameters=None, error_feedback: bool = True,
                 process_set=None, **policy):
        super().__init__(named_parameters, process_set, **policy)
        self.ratio = _settings.check_ratio(self._name, ratio)
        self.seed = _settings.check_seed(self._name, seed)
        self.error_feedback = _settings.check_flag(self._name, "error_feedback", error_feedback)


class RandomBlock(_SharedSeed):
    """Random-block sparsification with a shared seed (Eghlidi & Jaggi 2020), with error feedback.

    Each step, every rank sends the same cyclic block of ``k = max(1, round(ratio * numel))``
    contiguous elements of (residual + gradient); the block start is a pure function of
    ``(seed, step, parameter name)`` (Philox4x32-10), never of a global RNG. Because all ranks
    pick the same coordinates, the packed values ride Horovod's own allreduce with no indices
    on the wire. What is not sent stays in a per-parameter float32 residual.

    Args:
        ratio: fraction of each tensor sent per step, in (0, 1].
        seed: shared seed in [0, 2**64); must be the same on every rank.
        named_parameters: the model's ``named_parameters()``; keys the per-parameter state.
        error_feedback: keep what was not sent and add it to the next gradient (default True).
        process_set: the Horovod process set of the optimizer (default: all ranks; every compressor).
        min_numel, dense_1d, dense: the per-layer policy (every compressor; see _BoundCompressor).
    """

    def _compress(self, tensor, state, started):
        numel = tensor.numel()
        start = ops.random_block_start(self.seed, state.tensor_id, state.step, numel)
        state.step += 1
        values = exchange.to_wire(ops.block_pack(tensor, self._residual_of(state, tensor), start,
                                                 _settings.selected_count(self.ratio, numel)))
        self._account(state, tensor, values.numel(), values.numel() * values.element_size(), started)
        return values, (tensor.shape, tensor.dtype, start)

    def _decompress(self, tensor, ctx):
        shape, dtype, start = ctx
        return ops.block_unpack(tensor.to(dtype), shape.numel(), start).view(shape)


class _Gathering(_BoundCompressor):
    """Compressors whose coordinates differ per rank. The exchange, per tensor:
    ``"allgather"`` (values and int32 indices of every rank), ``"spardl"`` (sparse
    reduce-scatter + all-gather, O(k) bytes per rank whatever N; exchange.py) or ``"auto"``
    (default: dense allreduce, allgather or SparDL, whichever the cost model of
    sparsecomm._cost predicts fastest for that tensor, on ``network`` or on the network
    measured once on the first step). With ``dense_fallback`` (default), a tensor whose sparse
    payload (k values + k indices) would not be smaller than the dense tensor goes dense."""

    def __init__(self, named_parameters, process_set, dense_fallback: bool, exchange_: str = "auto",
                 network=None, **policy):
        super().__init__(named_parameters, process_set, **policy)
        self.dense_fallback = _settings.check_flag(self._name, "dense_fallback", dense_fallback)
        self.exchange, self.network = _settings.check_exchange(self._name, exchange_, network)
        self._choices: Dict[str, dict] = {}
        self._pending = []  # SparDL exchanges started in compress, not yet past their scatter

    def _density(self, step: int) -> float:
        return self.ratio

    def _value_bytes(self, tensor) -> float:
        return tensor.element_size()

    def _allowed(self):
        return _cost.EXCHANGES

    def _sparse_is_larger(self, name: str, tensor: torch.Tensor) -> bool:
        state = self._states.get(name)
        k = _settings.selected_count(self._density(state.step if state else 0), tensor.numel())
        if self.dense_fallback and k * (tensor.element_size() + 4) >= tensor.numel() * tensor.element_size():
            self._choices[name] = {"key": None, "exchange": "dense"}
            return True
        return self._exchange_for(name, tensor, k) == "dense"

    def _exchange_for(self, name: str, tensor: torch.Tensor, k: int) -> str:
        """The exchange of this tensor at k: the fixed one, or the cost model's choice (cached)."""
        if self.exchange != "auto":
            self._choices[name] = {"key": None, "exchange": self.exchange}
            return self.exchange
        ranks = self._ranks()
        if ranks == 1:
            return "allgather"
        key = (name, k)
        chosen = self._choices.get(name)
        if chosen is None or chosen["key"] != key:
            if self.network is None:
                self.network = exchange.measure_network(self.process_set)
            choice, predicted = _cost.choose(tensor.numel(), k, tensor.element_size(), self._value_bytes(tensor), ranks,
                                             self.network, self._allowed())
            chosen = self._choices[name] = {"key": key, "exchange": choice, "predicted_seconds": predicted}
        return chosen["exchange"]

    def _gather(self, tensor, state, started, values, index, bits=None):
        """After a pack: counts the step, starts the exchange, accounts, and returns what
        compress hands Horovod. values is (codes, scales) when quantized to `bits`."""
        k = _settings.selected_count(self._density(state.step), tensor.numel())
        state.step += 1
        if bits is not None:
            codes, scales = values
            placeholder, ctx = exchange.start_allgather_quantized(codes, scales, index, bits, state.name,
                                                                  tensor.shape, tensor.dtype, self.process_set)
        elif self._exchange_for(state.name, tensor, k) == "spardl":
            ctx = exchange.start_spardl(values, index, state.residual, k, state.name, tensor.shape, tensor.dtype,
                                        self.process_set)
            placeholder = torch.ones(1, dtype=torch.float32, device=values.device)
            self._pending.append(ctx)
        else:
            placeholder, ctx = exchange.start_allgather(values, index, state.name, tensor.shape, tensor.dtype,
                                                        self.process_set)
        ctx.parameter = state.name
        self._account(state, tensor, ctx.sent_elements, ctx.sent_bytes, started)
        return placeholder, ctx

    def _decompress(self, tensor, ctx):
        if isinstance(ctx, exchange.SparDL):
            # Every pending scatter is waited for and its gather started before any gather is
            # waited for: every rank has started all of them, whatever order Horovod decompresses in.
            sent_before = {id(c): c.sent_bytes for c in self._pending}
            for pending in self._pending:
                exchange.advance_spardl(pending)
                self._account_later(pending.parameter, pending.sent_bytes - sent_before[id(pending)], 0)
            self._pending = []
            result = exchange.finish_spardl(tensor, ctx)
        elif isinstance(ctx, exchange.QuantizedGathering):
            result = exchange.finish_allgather_quantized(tensor, ctx)
        else:
            result = exchange.finish_allgather(tensor, ctx)
        self._account_later(ctx.parameter, 0, ctx.received_bytes)
        return result


class TopK(_Gathering):
    """Exact top-k sparsification with error feedback: each rank sends the
    ``k = max(1, round(ratio * numel))`` entries of largest magnitude of (residual + gradient).
    Coordinates differ per rank, so values and int32 indices travel by allgather
    (sparsecomm.torch.exchange); what is not sent stays in a per-parameter float32 residual.

    Args:
        ratio: fraction of each tensor sent per step, in (0, 1].
        named_parameters: the model's ``named_parameters()``; keys the per-parameter state and
            names the allgathers.
        error_feedback: keep what was not sent and add it to the next gradient (default True).
        process_set: the Horovod process set of the optimizer (default: all ranks).
    """

    def __init__(self, ratio: float, named_parameters=None, error_feedback: bool = True, process_set=None,
                 dense_fallback: bool = True, exchange: str = "auto", network=None, **policy):
        super().__init__(named_parameters, process_set, dense_fallback, exchange, network, **policy)
        self.ratio = _settings.check_ratio(self._name, ratio)
        self.error_feedback = _settings.check_flag(self._name, "error_feedback", error_feedback)

    def _compress(self, tensor, state, started):
        values, index = ops.pack_topk(tensor, self._residual_of(state, tensor),
                                      _settings.selected_count(self.ratio, tensor.numel()),
                                      seed=0, tensor_id=state.tensor_id, step=state.step)
        return self._gather(tensor, state, started, values, index)


class RandomK(_SharedSeed):
    """Random-k sparsification with a shared seed, with error feedback: each step every rank
    sends the same ``k = max(1, round(ratio * numel))`` coordinates, drawn without replacement
    from ``(seed, step, parameter name)`` (a keyed permutation; no global RNG). Shared
    coordinates let the values ride Horovod's allreduce with no indices on the wire.

    Args: as RandomBlock (``ratio``, ``seed``, ``named_parameters``, ``error_feedback``).
    """

    def _compress(self, tensor, state, started):
        values, index = ops.pack_randomk(tensor, self._residual_of(state, tensor),
                                         _settings.selected_count(self.ratio, tensor.numel()), seed=self.seed,
                                         tensor_id=state.tensor_id, step=state.step)
        state.step += 1
        values = exchange.to_wire(values)
        self._account(state, tensor, values.numel(), values.numel() * values.element_size(), started)
        return values, (tensor.shape, tensor.dtype, index)

    def _decompress(self, tensor, ctx):
        shape, dtype, index = ctx
        return ops.sparse_unpack(tensor.to(dtype), index, shape.numel()).view(shape)


class RTopK(_Gathering):
    """rTop-k (Barnes et al. 2020), with error feedback: each rank sends ``k`` entries drawn
    uniformly at random from its ``r`` entries of largest magnitude of (residual + gradient),
    ``k = max(1, round(ratio * numel))``, ``r = max(k, round(r * numel))``. Coordinates
    differ per rank: values and indices travel by allgather.

    Args:
        ratio: fraction of each tensor sent per step, in (0, 1].
        r: fraction of each tensor to draw from, in [ratio, 1] (default: 4 * ratio, at most 1).
        seed: seeds the draw (with step and parameter name); no global RNG is used.
        named_parameters, error_feedback, process_set: as TopK.
    """

    def __init__(self, ratio: float, r: float = None, seed: int = 0, named_parameters=None,
                 error_feedback: bool = True, process_set=None, dense_fallback: bool = True, exchange: str = "auto",
                 network=None, **policy):
        super().__init__(named_parameters, process_set, dense_fallback, exchange, network, **policy)
        self.ratio = _settings.check_ratio(self._name, ratio)
        self.r = _settings.check_r(self._name, self.ratio, r)
        self.seed = _settings.check_seed(self._name, seed)
        self.error_feedback = _settings.check_flag(self._name, "error_feedback", error_feedback)

    def _compress(self, tensor, state, started):
        numel = tensor.numel()
        values, index = ops.pack_rtopk(tensor, self._residual_of(state, tensor), _settings.selected_count(self.r, numel),
                                       _settings.selected_count(self.ratio, numel), seed=self.seed,
                                       tensor_id=state.tensor_id, step=state.step)
        return self._gather(tensor, state, started, values, index)


class _SampledThreshold(_Gathering):
    """Shared by Threshold and DGC: a sampled magnitude threshold with bounded correction
    (the count stays in [0.8 k, 1.3 k]), values and indices by allgather."""

    def _check_common(self, ratio, sample_ratio, error_feedback):
        self.ratio = _settings.check_ratio(self._name, ratio)
        self.sample_ratio = _settings.check_ratio(self._name, sample_ratio, "sample_ratio")
        self.error_feedback = _settings.check_flag(self._name, "error_feedback", error_feedback)

    def _send(self, tensor, state, started, density, value_dtype=None, bits=None, momentum=None,
              momentum_factor=0.0, masking=True):
        values, index = ops.pack_sampled(tensor, self._residual_of(state, tensor), density, momentum=momentum,
                                         momentum_factor=momentum_factor, masking=masking,
                                         sample_ratio=self.sample_ratio, tensor_id=state.tensor_id, step=state.step,
                                         value_dtype=value_dtype, bits=bits)
        return self._gather(tensor, state, started, values, index, bits)


class Threshold(_SampledThreshold):
    """Gradient dropping (Aji & Heafield 2017), with error feedback: each rank sends the entries
    of (residual + gradient) whose magnitude reaches a threshold estimated from a sample, about
    ``ratio`` of each tensor (always within [0.8 k, 1.3 k]); the rest stays in the residual.

    Args:
        ratio: fraction of each tensor sent per step, in (0, 1] (the paper drops 99%: 0.01).
        quantize: None (values in the gradient's dtype), "fp16" or "bf16" (16-bit values), or
            "1bit" / "2bit" (sign, or sign and magnitude class, with per-tensor class means as
            scales; Aji & Heafield). The quantization error stays in the residual.
        sample_ratio: fraction of the tensor sampled to estimate the threshold (at least enough
            for about 256 sampled values above it).
        named_parameters, error_feedback, process_set: as TopK.
    """

    QUANTIZE = {None: None, "fp16": torch.float16, "bf16": torch.bfloat16, "1bit": 1, "2bit": 2}

    def __init__(self, ratio: float = 0.01, quantize=None, sample_ratio: float = 0.01, named_parameters=None,
                 error_feedback: bool = True, process_set=None, dense_fallback: bool = True, exchange: str = "auto",
                 network=None, **policy):
        super().__init__(named_parameters, process_set, dense_fallback, exchange, network, **policy)
        self._check_common(ratio, sample_ratio, error_feedback)
        self.quantize = _settings.check_quantize(self._name, quantize, self.exchange)

    def _allowed(self):
        return ("dense", "allgather") if self.quantize in ("1bit", "2bit") else _cost.EXCHANGES

    def _value_bytes(self, tensor):
        kind = self.QUANTIZE[self.quantize]
        if isinstance(kind, int):
            return kind / 8
        return tensor.element_size() if kind is None else 2

    def _compress(self, tensor, state, started):
        kind = self.QUANTIZE[self.quantize]
        if isinstance(kind, int):
            return self._send(tensor, state, started, self.ratio, bits=kind)
        return self._send(tensor, state, started, self.ratio, value_dtype=kind)


class DGC(_SampledThreshold):
    """Deep Gradient Compression (Lin et al. 2017): sampled-threshold sparsification of the
    momentum-corrected accumulation, per parameter and rank:

        g = clip(g, clip_norm / sqrt(N))      (local gradient clipping, optional, per tensor)
        u = momentum * u + g                  (momentum correction: momentum lives here)
        v = v + u;  send the entries of v above the sampled threshold; v[sent] = 0
        u[sent] = 0                           (momentum factor masking, default on)

    Warm-up: for the first ``warmup_steps`` steps (compress calls of a parameter), the density
    rises exponentially over ``warmup_stages`` equal stages, ratio ** ((s + 1) / (stages + 1))
    at stage s: 25%, 6.3%, 1.6%, 0.4%, then 0.1% for ratio 0.001 and 4 stages, as in the paper.

    Pair it with a plain SGD optimizer (``momentum=0``): the momentum is DGC's. A tensor sent
    dense (the per-layer policy, or a density at which sparse would be larger) gets momentum SGD,
    ``u = momentum * u + g`` reduced whole, as the paper's dense layers do. With ratio=1 and
    momentum_masking=False (and dense_fallback=False) it is exactly distributed momentum SGD.

    Args:
        ratio: final density, in (0, 1] (the paper: 0.001).
        momentum: momentum factor in [0, 1).
        momentum_masking: zero the momentum of sent entries (default True).
        clip_norm: local gradient clipping threshold before scaling by 1/sqrt(N) (None: off).
        warmup_steps, warmup_stages: the warm-up schedule (0 steps: none).
        sample_ratio, named_parameters, process_set: as Threshold.
    """

    def __init__(self, ratio: float = 0.001, momentum: float = 0.9, momentum_masking: bool = True,
                 clip_norm: Optional[float] = None, warmup_steps: int = 0, warmup_stages: int = 4,
                 sample_ratio: float = 0.01, named_parameters=None, process_set=None, dense_fallback: bool = True,
                 exchange: str = "auto", network=None, **policy):
        super().__init__(named_parameters, process_set, dense_fallback, exchange, network, **policy)
        self._check_common(ratio, sample_ratio, True)
        self.momentum = _settings.check_dgc(self._name, momentum, momentum_masking, clip_norm, warmup_steps,
                                            warmup_stages)
        self.momentum_masking = momentum_masking
        self.clip_norm = clip_norm
        self.warmup_steps = warmup_steps
        self.warmup_stages = warmup_stages

    def _density(self, step: int) -> float:
        return self.density(step)

    def density(self, step: int) -> float:
        """The density at a parameter's step: the warm-up schedule, then ratio."""
        if step >= self.warmup_steps:
            return self.ratio
        stage = step * self.warmup_stages // self.warmup_steps
        return self.ratio ** ((stage + 1) / (self.warmup_stages + 1))

    def _momentum_of(self, state, tensor):
        if state.momentum is None:
            state.momentum = torch.zeros(tensor.numel(), dtype=torch.float32, device=tensor.device)
        return state.momentum

    def _clipped(self, tensor):
        """Local gradient clipping: the threshold scaled by 1/sqrt(N) (the paper's rule)."""
        if self.clip_norm is None:
            return tensor
        ranks = (self.process_set or exchange._hvd().global_process_set).size()
        limit = self.clip_norm / math.sqrt(ranks)
        norm = float(tensor.float().norm())
        return tensor * (limit / norm) if norm > limit else tensor

    def _dense(self, tensor, state):
        """Momentum SGD for a gradient sent dense (policy, or sparse would be larger): u = m u + g,
        and u is what is reduced, so DGC + plain SGD keeps momentum on every tensor."""
        momentum = self._momentum_of(state, tensor)
        ops.accumulate_candidates(self._clipped(tensor), None, float("inf"), momentum=momentum,
                                  momentum_factor=self.momentum)
        state.step += 1  # the warm-up counts these steps too
        return momentum.to(tensor.dtype, copy=True).view(tensor.shape)  # Horovod reduces in place: a copy

    def _compress(self, tensor, state, started):
        return self._send(self._clipped(tensor), state, started, self.density(state.step),
                          momentum=self._momentum_of(state, tensor), momentum_factor=self.momentum,
                          masking=self.momentum_masking)
