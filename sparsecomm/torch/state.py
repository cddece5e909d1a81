"""Per-parameter state of a compressor, keyed by parameter name.

Horovod calls ``compress(p.grad)`` with the gradient tensor itself and nothing else: no
name, no step. A compressor bound to the model's ``named_parameters`` finds the owning
parameter by identity (``p.grad is tensor``); this stays right when
``zero_grad(set_to_none=True)`` creates a new gradient tensor every step. A tensor that is
no parameter's ``.grad`` is refused loudly: state is never mixed between tensors.
"""

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..core import report
from ..core.loss_scale import UNSET
from ..core.selection import tensor_id


@dataclass
class Backup:
    """A parameter state just before its last update (loss_scaler= only), so that an update
    whose step overflowed can be undone. The buffers are allocated on the first backup and
    copied into from then on: no allocation per step."""

    step: int = 0
    valid: bool = False  # taken since the last rollback, settlement or restore
    tensors: bool = False  # residual and momentum were copied (False: the update leaves them)
    had_residual: bool = False
    had_momentum: bool = False
    residual: torch.Tensor | None = None
    momentum: torch.Tensor | None = None


@dataclass
class ParameterState:
    name: str
    tensor_id: int
    step: int = 0  # compress calls so far (one per Horovod allreduce)
    residual: torch.Tensor | None = None  # float32, numel of the parameter (error feedback)
    momentum: torch.Tensor | None = None  # float32, numel of the parameter (DGC momentum correction)
    loss_scale: float = UNSET  # the loss scale residual and momentum are in (loss_scaler= only)
    backup: Backup | None = None  # the state before the last update (loss_scaler= only)

    @classmethod
    def fresh(cls, name, step=0):
        return cls(name, tensor_id(name), step)

    def residual_for(self, tensor, keeps_residual):
        """The float32 residual (created on first use), or None without error feedback."""
        if keeps_residual and self.residual is None:
            self.residual = torch.zeros(tensor.numel(), dtype=torch.float32, device=tensor.device)
        return self.residual

    def momentum_for(self, tensor):
        if self.momentum is None:
            self.momentum = torch.zeros(tensor.numel(), dtype=torch.float32, device=tensor.device)
        return self.momentum

    # -- loss scaling (sparsecomm.core.loss_scale) ----------------------------------------------

    def back_up(self, tensors=True):
        """Remembers the state before an update: the step, and (when `tensors`: the update may
        change them) residual and momentum, copied into buffers allocated once."""
        backup = self.backup = self.backup or Backup()
        backup.step, backup.valid, backup.tensors = self.step, True, tensors
        if tensors:
            backup.had_residual, backup.had_momentum = self.residual is not None, self.momentum is not None
            backup.residual = _copied(self.residual, backup.residual)
            backup.momentum = _copied(self.momentum, backup.momentum)

    @property
    def backed_up(self):
        return self.backup is not None and self.backup.valid

    def roll_back(self):
        """Undoes the update since the backup (its step overflowed): the state and step as they
        were. State created by that update (a first residual) is zeroed, as if never made."""
        backup = self.backup
        self.step, backup.valid = backup.step, False
        if backup.tensors:
            for live, had, saved in (
                (self.residual, backup.had_residual, backup.residual),
                (self.momentum, backup.had_momentum, backup.momentum),
            ):
                if live is not None and had:
                    live.copy_(saved)
                elif live is not None:
                    live.zero_()

    def rescale(self, factor):
        """Residual and momentum into a new loss scale: times new / old (exact for powers of two)."""
        for tensor in (self.residual, self.momentum):
            if tensor is not None:
                tensor.mul_(factor)


def _copied(source, buffer):
    """`source` copied into `buffer` (allocated on first use); None without a source."""
    if source is None:
        return buffer
    if buffer is None:
        return source.clone()
    return buffer.copy_(source)


class Counters:
    """What stats() reports: per-parameter counters (plain numbers: cheap to add to at every
    compress), and their totals, summed when read, plus the totals a checkpoint restored."""

    KEYS = ("calls", "dense_bytes", "sent_bytes", "received_bytes", "compress_seconds")

    def __init__(self):
        self.restored = dict.fromkeys(self.KEYS, 0)  # the totals of a loaded state_dict, before its counters
        self.tensors: dict[str, dict] = {}
        self._on_device = {}  # (names) -> their sent elements still on the device, summed there
        self._repeated = {}  # a bucket's key -> [its rows, how many steps sent them, their seconds], not added yet

    def account(self, name, numel, dense_bytes, sent_elements, sent_bytes, received_bytes, seconds):
        """One compress of a tensor of `numel` elements: what a dense allreduce would have been
        handed (dense_bytes), and what its route sent."""
        per = self.tensors.get(name)
        if per is None:
            per = self.tensors[name] = dict({key: 0 for key in report.COUNTERS}, compress_seconds=0.0, numel=numel)
        per["calls"] += 1
        per["dense_bytes"] += dense_bytes
        per["sent_elements"] += sent_elements
        per["sent_bytes"] += sent_bytes
        per["received_bytes"] += received_bytes
        per["compress_seconds"] += seconds

    def account_bucket(self, key, rows, seconds):
        """One compress of a bucket's tensors (`key` names the bucket): rows of (name, numel, dense_bytes,
        sent_elements, sent_bytes, received_bytes), the seconds shared among them. Rows equal to the
        bucket's last ones (a training's steady state) are only counted, and added when read."""
        held = self._repeated.get(key)
        if held is not None and held[0] == rows:
            held[1] += 1
            held[2] += seconds
            return
        if held is not None:
            self._add_repeated(*held)
        self._repeated[key] = [rows, 1, seconds]

    def _add_repeated(self, rows, steps, seconds):
        share = seconds / max(1, len(rows))
        for name, numel, dense_bytes, sent_elements, sent_bytes, received_bytes in rows:
            self.account(name, numel, 0, 0, 0, 0, share)
            per = self.tensors[name]
            per["calls"] += steps - 1
            per["dense_bytes"] += steps * dense_bytes
            per["sent_elements"] += steps * sent_elements
            per["sent_bytes"] += steps * sent_bytes
            per["received_bytes"] += steps * received_bytes

    def _settle(self):
        """Every count held back (account_bucket's repeated rows, account_on_device's sums) added."""
        held, self._repeated = self._repeated, {}
        for rows, steps, seconds in held.values():
            self._add_repeated(rows, steps, seconds)

    def account_on_device(self, names, sent_elements):
        """Sent elements that stay on the device (a DDP bucket's fixed-capacity counts, int64, one a
        name): added up there, one op a call, and read on the host when stats() is."""
        key = tuple(names)
        held = self._on_device.get(key)
        if held is None:
            self._on_device[key] = sent_elements.clone()
        else:
            held.add_(sent_elements)

    def _read_on_device(self):
        self._settle()
        held, self._on_device = self._on_device, {}
        for names, counts in held.items():
            for name, count in zip(names, counts.tolist()):
                self.tensors[name]["sent_elements"] += count

    def account_later(self, name, sent_bytes, received_bytes):
        """Bytes known only in decompress (what the gathers brought, a second phase's payload)."""
        per = self.tensors.get(name)
        if per is None:
            self._settle()
            per = self.tensors[name]
        per["sent_bytes"] += sent_bytes
        per["received_bytes"] += received_bytes

    @property
    def totals(self):
        self._settle()
        counted = report.totals(self.tensors, self.KEYS)
        return {key: self.restored[key] + counted[key] for key in self.KEYS}

    def restore(self, totals):
        """After load_state_dict: the totals read as the saved ones (new compresses add to them)."""
        counted = self.totals
        self.restored = {key: self.restored[key] + totals.get(key, counted[key]) - counted[key] for key in self.KEYS}

    def stats(self, choices):
        self._read_on_device()
        tensors = {
            name: report.tensor_stats({k: v for k, v in per.items() if k != "numel"}, per["numel"], choices.get(name))
            for name, per in self.tensors.items()
        }
        return dict(self.totals, tensors=tensors)


def state_dict(owner, states, counters):
    """A compressor's state for checkpoints (each rank saves its own: residuals differ per
    rank): per parameter, the step, residual, momentum and the loss scale they are in (UNSET
    without loss_scaler); and the stats totals."""
    return {
        "compressor": owner,
        "parameters": {
            name: {"step": s.step, "residual": s.residual, "momentum": s.momentum, "loss_scale": s.loss_scale}
            for name, s in states.items()
        },
        "stats": dict(counters.totals),
    }


def local_numel(param):
    """The elements of `param` on this rank: a DTensor's local shard (FSDP), or all of a tensor."""
    local = getattr(param, "_local_tensor", None)
    return param.numel() if local is None else local.numel()


def load_states(owner, binding, saved, counters):
    """The parameter states of a state_dict(), checked against the bound parameters."""
    if not isinstance(saved, dict) or "parameters" not in saved:
        raise TypeError(f"{owner}: load_state_dict expects what state_dict() returned, got {type(saved).__name__}")
    if saved.get("compressor") != owner:
        raise ValueError(f"{owner}: the state was saved by {saved.get('compressor')!r}, not {owner}")
    if binding is None:
        raise RuntimeError(f"{owner}: bind named_parameters= before load_state_dict")
    states = {}
    for name, entry in saved["parameters"].items():
        param = binding.params.get(name)
        if param is None:
            raise KeyError(f"{owner}: the state has parameter {name!r}, which is not among named_parameters")
        restored = ParameterState.fresh(name, int(entry["step"]))
        restored.loss_scale = float(entry.get("loss_scale", UNSET))  # the scale residual and momentum are in
        for key in ("residual", "momentum"):
            tensor = entry.get(key)
            if tensor is not None and tensor.numel() != local_numel(param):
                raise ValueError(
                    f"{owner}: the saved {key} of {name!r} has {tensor.numel()} elements, the parameter "
                    f"{local_numel(param)} on this rank"
                )
            setattr(restored, key, None if tensor is None else tensor.to(param.device, torch.float32).clone())
        states[name] = restored
    counters.restore(saved.get("stats", {}))
    return states


class ParameterBinding:
    """The bound parameters of one compressor, and lookup of a gradient's owner."""

    def __init__(self, owner: str, named_parameters: Iterable[tuple[str, torch.Tensor]]):
        self.owner = owner
        if isinstance(named_parameters, torch.nn.Module):
            raise TypeError(
                f"{owner}: named_parameters should be an iterable of (name, parameter) pairs such as "
                f"model.named_parameters(), got the module itself; pass model.named_parameters()"
            )
        self.params: dict[str, torch.Tensor] = {}
        names, seen = set(), set()
        for item in named_parameters:
            if not (
                isinstance(item, tuple)
                and len(item) == 2
                and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)
            ):
                raise TypeError(f"{owner}: named_parameters should yield (str, torch.Tensor) pairs, got {item!r:.80}")
            name, p = item
            if name in names:
                raise ValueError(f"{owner}: named_parameters has the name {name!r} twice")
            names.add(name)
            # A tied parameter listed again (named_parameters(remove_duplicate=False)) keeps its
            # first name: the key of its state and the name of its collectives.
            if id(p) not in seen:
                seen.add(id(p))
                self.params[name] = p
        if not self.params:
            raise ValueError(f"{owner}: named_parameters is empty")
        self._order = list(self.params.items())
        self.names = {id(p): name for name, p in self._order}  # by the parameter itself (the DDP hook)
        self._next = len(self._order) - 1  # where name_of looks first: the backward starts at the end

    def name_of(self, grad: torch.Tensor) -> str:
        """The name of the parameter whose .grad is `grad`. A gradient is a new tensor at every
        step (zero_grad sets .grad to None), and the backward hands them over in about the reverse
        of the parameters' order: the search starts beside the last one found and widens both
        ways, so a step's lookups cost about one comparison each. (A map by id(), rebuilt on a
        miss, missed on every new gradient: 4 ms a step at 161 tensors, 27 at 400, 169 at 1000;
        this search takes 0.15, 0.4 and 1 ms.)"""
        name, count = None, len(self._order)
        for tried in range(count):  # offsets 0, -1, +1, -2, +2, ...: every index once
            offset = (tried + 1) // 2
            index = (self._next + (-offset if tried % 2 else offset)) % count
            candidate, p = self._order[index]
            if p.grad is grad:
                name, self._next = candidate, (index - 1) % count
                break
        if name is None:
            name = self._densified_sparse_grad(grad)
        if name is None:
            raise LookupError(
                f"{self.owner}: got a gradient (shape {list(grad.shape)}, {grad.dtype}) that is not the .grad of any "
                f"parameter passed as named_parameters=. Pass the same model's named_parameters() to the compressor "
                f"and to hvd.DistributedOptimizer. (op=hvd.Adasum compresses parameter deltas, not gradients, and "
                f"sparse_as_dense densifies a sparse .grad into a new tensor, which is attributed only when "
                f"exactly one parameter has a sparse .grad of that shape.)"
            )
        return name

    def _densified_sparse_grad(self, grad: torch.Tensor):
        """hvd.DistributedOptimizer(sparse_as_dense=True) passes p.grad.to_dense(), a new tensor:
        it belongs to the one parameter whose .grad is sparse with that shape, if only one is."""
        if grad.is_sparse:
            return None
        owners = [
            n for n, p in self.params.items() if p.grad is not None and p.grad.is_sparse and p.grad.shape == grad.shape
        ]
        if len(owners) > 1:
            raise LookupError(
                f"{self.owner}: a densified sparse gradient of shape {list(grad.shape)} could belong "
                f"to {owners}; give those parameters different shapes or list them in dense="
            )
        return owners[0] if owners else None


_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class CompressorState:
    """What one compressor keeps: its parameters' states, found from each gradient through the
    binding, and the counters of stats(); saved, loaded and compared across ranks here."""

    def __init__(self, owner: str, named_parameters=None):
        self.owner = owner
        self.binding = None if named_parameters is None else ParameterBinding(owner, named_parameters)
        self.parameters: dict[str, ParameterState] = {}
        self.counters = Counters()

    def for_gradient(self, tensor: torch.Tensor) -> ParameterState:
        """The state of the parameter whose gradient `tensor` is (made on its first step)."""
        if self.binding is None:
            raise RuntimeError(
                f"{self.owner} keeps per-parameter state and needs named_parameters=: construct it as "
                f"{self.owner}(..., named_parameters=model.named_parameters())"
            )
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in _FLOAT_DTYPES:
            got = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"{self.owner}: gradients should be float32, float16 or bfloat16, got {got}")
        return self.named(self.binding.name_of(tensor))

    def named(self, name: str) -> ParameterState:
        """The state of the bound parameter `name` (made on its first step)."""
        state = self.parameters.get(name)
        if state is None:
            state = self.parameters[name] = ParameterState.fresh(name)
        return state

    def of_parameter(self, param: torch.Tensor) -> ParameterState:
        """The state of a bound parameter, found by identity (a hook's parameters)."""
        name = self.binding.names.get(id(param)) if self.binding is not None else None
        if name is None:
            raise LookupError(
                f"{self.owner}: a parameter of shape {list(param.shape)} is not among the named_parameters= the "
                f"compressor was given: pass the same model's named_parameters() (under FSDP, after fully_shard)"
            )
        return self.named(name)

    def step_of(self, name: str) -> int:
        state = self.parameters.get(name)
        return state.step if state else 0

    def state_dict(self) -> dict:
        return state_dict(self.owner, self.parameters, self.counters)

    def load_state_dict(self, saved: dict) -> None:
        self.parameters = load_states(self.owner, self.binding, saved, self.counters)

    def shared(self) -> dict:
        """What every rank must hold alike (sparsecomm.core.agreement): each bound parameter's step."""
        names = self.binding.params if self.binding is not None else ()
        return {name: {"step": self.step_of(name)} for name in names}

    def adopt(self, shared: dict) -> None:
        for name, fields in shared.items():
            self.parameters.setdefault(name, ParameterState.fresh(name)).step = fields["step"]
