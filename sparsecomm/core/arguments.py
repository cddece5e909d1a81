"""Each compressor's constructor, declared once for torch and TF: its arguments in order, their
defaults and their docs. A compressor class of either framework names its method
(``method_type``); its signature and the "Args:" of its docstring come from here, so a new
method is one entry of ORDER (and its Method in core/methods.py), not a constructor per
framework."""

import inspect
import textwrap

REQUIRED = inspect.Parameter.empty
BINDING = "binding"  # stands for the framework's own argument: named_parameters= or variables=
FRAMEWORK_BINDING = {"torch": "named_parameters", "tensorflow": "variables"}
ADAPTER = ("process_set", "loss_scaler")  # what the compressor itself takes
ROUTING = ("dense_fallback", "exchange", "network")  # what the planner takes (core.plan.Planner)
POLICY = "policy"  # min_numel=, dense_1d=, dense= (core.plan.Policy), as keywords
POLICY_NAMES = ("min_numel", "dense_1d", "dense")

_TAIL = ((BINDING, None), ("error_feedback", True), ("process_set", None))
_ROUTED = (("dense_fallback", True), ("exchange", "auto"), ("network", None), ("loss_scaler", None))
_SHARED_SEED = (("ratio", REQUIRED), ("seed", 0), *_TAIL, ("loss_scaler", None))

ORDER = {  # method -> (argument, default) in the constructor's order
    "RandomBlock": _SHARED_SEED,
    "RandomK": _SHARED_SEED,
    "TopK": (("ratio", REQUIRED), *_TAIL, *_ROUTED),
    "RTopK": (("ratio", REQUIRED), ("r", None), ("seed", 0), *_TAIL, *_ROUTED),
    "Threshold": (("ratio", 0.01), ("quantize", None), ("sample_ratio", 0.01), *_TAIL, *_ROUTED),
    "DGC": (
        ("ratio", 0.001),
        ("momentum", 0.9),
        ("momentum_masking", True),
        ("clip_norm", None),
        ("warmup_steps", 0),
        ("warmup_stages", 4),
        ("sample_ratio", 0.01),
        ("nesterov", False),
        (BINDING, None),
        ("process_set", None),
        *_ROUTED,
    ),
}

DOCS = {
    "ratio": "fraction of each tensor sent per step, in (0, 1].",
    "seed": "shared seed in [0, 2**64); must be the same on every rank.",
    "named_parameters": "the model's ``named_parameters()``; keys the per-parameter state and names the collectives.",
    "variables": "the model's trainable variables, or (name, variable) pairs; keys the per-variable state.",
    "error_feedback": "keep what was not sent and add it to the next gradient (default True).",
    "process_set": "the optimizer's Horovod process set (default: all ranks); under ddp_hook, DDP's process group.",
    "loss_scaler": (
        "mixed precision: the ``torch.amp.GradScaler`` (TF: the Keras 3 ``LossScaleOptimizer``) whose scale "
        "multiplies the loss. Residuals (and DGC's momentum) follow its scale, and a step it skips leaves no "
        'trace here (docs/compressors.md, "Mixed precision").'
    ),
    "dense_fallback": "a tensor whose sparse payload would not be smaller than the tensor goes dense (default True).",
    "exchange": (
        '"allgather" (every rank\'s values and 2-byte offsets), "spardl" (sparse reduce-scatter + all-gather: '
        'O(k) bytes per rank whatever the number of ranks), "hierarchical" (SparDL inside each host, then only '
        'the host\'s k pairs between hosts; docs/exchanges.md) or "auto" (default: per tensor, whichever '
        "sparsecomm.core.cost predicts fastest, where it is predicted at least 20% faster than dense; else dense)."
    ),
    "network": 'the network "auto" predicts for (default: measured on the first steps).',
    "r": "fraction of each tensor to draw from, in [ratio, 1] (default: 1.25 * ratio, at most 1).",
    "quantize": (
        'None (values in the gradient\'s dtype), "fp16" or "bf16" (16-bit values), or "1bit" / "2bit" (sign, or '
        "sign and magnitude class, with per-tensor class means as scales; Aji & Heafield). The quantization "
        "error stays in the residual."
    ),
    "sample_ratio": "fraction of the tensor sampled to estimate the threshold (at least about 256 values above it).",
    "momentum": "momentum factor in [0, 1).",
    "momentum_masking": "zero the momentum of sent entries (default True).",
    "clip_norm": (
        "local gradient clipping threshold before scaling by 1/sqrt(N) (None: off); under a loss_scaler it "
        "applies to the unscaled gradient."
    ),
    "nesterov": (
        "Nesterov momentum as DGC's official code runs it, u = momentum * (u + g) and acc = residual + u + g "
        "(default False: u = momentum * u + g, acc = residual + u)."
    ),
    "warmup_steps": "the warm-up schedule's length in steps of a tensor (0: none).",
    "warmup_stages": "the warm-up schedule's equal stages.",
    POLICY: "min_numel, dense_1d, dense (keywords): the per-layer policy (sparsecomm.core.plan.Policy).",
}
DOCS_OF = {  # where one method's argument means more than DOCS says
    ("RTopK", "seed"): "seeds the draw (with the rank, step and parameter name: each rank draws on its own, "
    "as the paper analyses it); no global RNG is used.",
    ("Threshold", "ratio"): "fraction of each tensor sent per step, in (0, 1] (the paper drops 99%: 0.01).",
    ("DGC", "ratio"): "final density, in (0, 1] (the paper: 0.001).",
}


def _order(method, framework):
    binding = FRAMEWORK_BINDING[framework]
    return [(binding if name == BINDING else name, default) for name, default in ORDER[method]]


def signature(method, framework):
    """The constructor's signature of `method`'s compressor in `framework` ("torch", "tensorflow")."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter(name, kind, default=default) for name, default in _order(method, framework)]
    return inspect.Signature(parameters + [inspect.Parameter(POLICY, inspect.Parameter.VAR_KEYWORD)])


def documented(summary, method, framework):
    """`summary` (a class's own docstring) followed by the "Args:" of its arguments."""
    names = [name for name, _ in _order(method, framework)] + [POLICY]
    lines = [
        textwrap.fill(
            f"{name}: {DOCS_OF.get((method, name), DOCS[name])}", 96, initial_indent=" " * 8, subsequent_indent=" " * 12
        )
        for name in names
    ]
    return (summary or "").rstrip() + "\n\n    Args:\n" + "\n".join(lines) + "\n"


class Given:
    """A constructor call's arguments, sorted by who takes them: the method (built here), the
    settings (core.compressor.Settings: the policy's and the planner's), the binding and the
    compressor's own (process_set, loss_scaler)."""

    def __init__(self, owner, method_type, framework, args, kwargs):
        try:
            bound = signature(method_type.__name__, framework).bind(*args, **kwargs)
        except TypeError as error:  # Python's words, without the class: "missing a required argument: 'ratio'"
            raise TypeError(f"{owner}: {error}") from None
        bound.apply_defaults()
        given = dict(bound.arguments)
        self.settings = given.pop(POLICY)  # the policy's keywords, then the planner's
        unknown = sorted(set(self.settings) - set(POLICY_NAMES))
        if unknown:
            takes = ", ".join(name for name, _ in _order(method_type.__name__, framework))
            raise TypeError(
                f"{owner}: unexpected argument {unknown[0]!r}; it takes {takes} and the policy's {POLICY_NAMES}"
            )
        self.binding = given.pop(FRAMEWORK_BINDING[framework])
        self.process_set, self.loss_scaler = (given.pop(name) for name in ADAPTER)
        method_takes = inspect.signature(method_type.__init__).parameters
        for name in ROUTING:
            if name in given:
                value = given[name] if name in method_takes else given.pop(name)
                self.settings[name] = value
        self.method = method_type(owner, **given)  # validated, named after the compressor class
