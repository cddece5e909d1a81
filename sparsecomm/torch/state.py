"""Per-parameter state of a compressor, keyed by parameter name.

Horovod calls ``compress(p.grad)`` with the gradient tensor itself and nothing else: no
name, no step. A compressor bound to the model's ``named_parameters`` finds the owning
parameter by identity (``p.grad is tensor``); this stays right when
``zero_grad(set_to_none=True)`` creates a new gradient tensor every step. A tensor that is
no parameter's ``.grad`` is refused loudly: state is never mixed between tensors.
"""
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple

import torch


@dataclass
class ParameterState:
    name: str
    tensor_id: int
    step: int = 0                            # compress calls so far (one per Horovod allreduce)
    residual: Optional[torch.Tensor] = None  # float32, numel of the parameter (error feedback)
    momentum: Optional[torch.Tensor] = None  # float32, numel of the parameter (DGC momentum correction)


class ParameterBinding:
    """The bound parameters of one compressor, and lookup of a gradient's owner."""

    def __init__(self, owner: str, named_parameters: Iterable[Tuple[str, torch.Tensor]]):
        self.owner = owner
        if isinstance(named_parameters, torch.nn.Module):
            raise TypeError(f"{owner}: named_parameters should be an iterable of (name, parameter) pairs such as "
                            f"model.named_parameters(), got the module itself; pass model.named_parameters()")
        self.params: Dict[str, torch.Tensor] = {}
        seen = {}
        for item in named_parameters:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], torch.Tensor)):
                raise TypeError(f"{owner}: named_parameters should yield (str, torch.Tensor) pairs, got {item!r:.80}")
            name, p = item
            if name in self.params:
                raise ValueError(f"{owner}: named_parameters has the name {name!r} twice")
            if id(p) in seen:
                raise ValueError(f"{owner}: the same parameter is named both {seen[id(p)]!r} and {name!r}")
            seen[id(p)] = name
            self.params[name] = p
        if not self.params:
            raise ValueError(f"{owner}: named_parameters is empty")
        self._by_grad = {}  # id(p.grad) -> name, rebuilt when a gradient is not found

    def name_of(self, grad: torch.Tensor) -> str:
        name = self._by_grad.get(id(grad))
        if name is None or self.params[name].grad is not grad:
            self._by_grad = {id(p.grad): n for n, p in self.params.items() if p.grad is not None}
            name = self._by_grad.get(id(grad))
        if name is None:
            name = self._densified_sparse_grad(grad)
        if name is None:
            raise LookupError(
                f"{self.owner}: got a gradient (shape {list(grad.shape)}, {grad.dtype}) that is not the .grad of any "
                f"parameter passed as named_parameters=. Pass the same model's named_parameters() to the compressor "
                f"and to hvd.DistributedOptimizer. (op=hvd.Adasum compresses parameter deltas, not gradients, and "
                f"sparse_as_dense densifies a sparse .grad into a new tensor, which is attributed only when "
                f"exactly one parameter has a sparse .grad of that shape.)")
        return name

    def _densified_sparse_grad(self, grad: torch.Tensor):
        """hvd.DistributedOptimizer(sparse_as_dense=True) passes p.grad.to_dense(), a new tensor:
        it belongs to the one parameter whose .grad is sparse with that shape, if only one is."""
        if grad.is_sparse:
            return None
        owners = [n for n, p in self.params.items()
                  if p.grad is not None and p.grad.is_sparse and p.grad.shape == grad.shape]
        if len(owners) > 1:
            raise LookupError(f"{self.owner}: a densified sparse gradient of shape {list(grad.shape)} could belong "
                              f"to {owners}; give those parameters different shapes or list them in dense=")
        return owners[0] if owners else None
