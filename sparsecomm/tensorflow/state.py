"""Per-variable state of a TensorFlow compressor, and which variable a gradient belongs to.

Horovod's TF front end calls ``compress(grad)`` with the gradient alone, inside a
tf.function trace (``DistributedGradientTape`` traces even in eager mode), so the
compressor can neither see the variable nor keep Python counters per step. Hence:

- State lives in TF variables created when the compressor is bound to the model's
  variables (before any trace: a tf.Variable cannot be created on a later trace). A
  `VariableState` per bound variable holds its step, residual, momentum and counters; it is
  a tf.Module, so ``tf.train.Checkpoint(compression=compressor)`` saves and restores it.
- State is found by position in the bound list (or, with `expect`, by the variable's
  identity), never by name. Names are for stats(), error messages, the policy's dense=
  patterns and the random streams (`tensor_id(name)`), so each bound variable gets a name of
  its own: the one given in a (name, variable) pair (pairs must not repeat one), else the
  variable's Keras path or TF name, where a repeat (TF names every unnamed variable
  "Variable") becomes name_1, name_2, ... in binding order: the same on every rank.
- A gradient is attributed by order: Horovod reduces gradients in the order of the
  tape's sources (and of the optimizer's variables), so within one trace the n-th compress
  call takes the first not yet attributed bound variable with the gradient's shape and
  dtype. Variables whose gradient is None or IndexedSlices (never compressed) are skipped
  by the shape match. The one ambiguity, a skipped variable followed by one of the same
  shape, is avoided by binding only the variables that get dense gradients, or by
  sparsecomm's Keras wrapper, which tells the binding each gradient's variable (`expect`).
"""

import contextlib
import weakref

import tensorflow as tf

from ..core import loss_scale, report
from ..core.selection import tensor_id


class VariableState(tf.Module):
    """One bound variable's state: step (compress calls so far), float32 residual and
    momentum (flat, created only where the method uses them), and stats counters. Under a
    loss scaler (`scaled`) also the loss scale residual and momentum are in, and their backup
    before the last update, with its step (checkpointed too: a restored state can still roll
    back its last update)."""

    def __init__(self, name, shape, dtype, residual, momentum, scaled=False):
        super().__init__()
        self._variable_name, self._shape, self._dtype = name, shape, dtype
        self._tensor_id = tensor_id(name)
        numel = shape.num_elements()
        counter = lambda: tf.Variable(0, dtype=tf.int64, trainable=False)  # noqa: E731
        self.step = counter()
        self.calls, self.sent_elements, self.sent_bytes, self.received_bytes = (
            counter(),
            counter(),
            counter(),
            counter(),
        )
        self.residual = tf.Variable(tf.zeros([numel]), trainable=False) if residual else None
        self.momentum = tf.Variable(tf.zeros([numel]), trainable=False) if momentum else None
        if scaled:
            self.loss_scale = tf.Variable(loss_scale.UNSET, dtype=tf.float32, trainable=False)
            self.backup_step = counter()
            self.backup_valid = tf.Variable(False, trainable=False)
            self.backup_residual = tf.Variable(tf.zeros([numel]), trainable=False) if residual else None
            self.backup_momentum = tf.Variable(tf.zeros([numel]), trainable=False) if momentum else None

    @property
    def variable_name(self):
        return self._variable_name

    @property
    def tensor_id(self):
        return self._tensor_id

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return self._dtype

    @property
    def numel(self):
        return self._shape.num_elements()

    def read_residual(self):
        return self.residual.read_value() if self.residual is not None else None

    def updates(self, residual, momentum, counts_step):
        """The assignments of one compress: the state after the pack (where kept), step + 1."""
        updates = [self.step.assign_add(1)] if counts_step else []
        if residual is not None and self.residual is not None:
            updates.append(self.residual.assign(residual))
        if momentum is not None:
            updates.append(self.momentum.assign(momentum))
        return updates

    def _kept(self):
        """(state variable, its backup) pairs."""
        return [
            (live, copy)
            for live, copy in ((self.residual, self.backup_residual), (self.momentum, self.backup_momentum))
            if live is not None
        ]

    def follow_loss_scale(self, scale):
        """sparsecomm.core.loss_scale's rule, in the graph: a scale lower than the remembered one
        restores the backup (state and step: the last update's step overflowed); a different
        one multiplies residual and momentum by new / remembered; then the state is in `scale`."""
        decision = loss_scale.decide(
            self.loss_scale.read_value(), scale, self.backup_valid.read_value(), select=tf.where
        )

        def roll_back():
            self.step.assign(self.backup_step.read_value())
            self.backup_valid.assign(False)
            for live, copy in self._kept():
                live.assign(copy.read_value())

        def rescale():
            for live, _ in self._kept():
                live.assign(live.read_value() * decision.factor)

        tf.cond(decision.rollback, roll_back, lambda: None)
        tf.cond(tf.not_equal(decision.factor, 1.0), rescale, lambda: None)
        self.loss_scale.assign(scale)

    def back_up(self):
        """The state before an update: copied into the backup variables."""
        self.backup_step.assign(self.step.read_value())
        self.backup_valid.assign(True)
        for live, copy in self._kept():
            copy.assign(live.read_value())

    def counted(self, tensor, sent_elements, sent_bytes, received_bytes):
        """`tensor`, once the stats counters of one compress are updated."""
        updates = [
            self.calls.assign_add(1),
            self.sent_elements.assign_add(tf.cast(sent_elements, tf.int64)),
            self.sent_bytes.assign_add(tf.cast(sent_bytes, tf.int64)),
            self.received_bytes.assign_add(tf.cast(received_bytes, tf.int64)),
        ]
        with tf.control_dependencies(updates):
            return tf.identity(tensor)

    def counters(self):
        """The stats counters as ints (eager), with the dense bytes of the calls so far."""
        counters = {key: int(getattr(self, key).numpy()) for key in report.COUNTERS if key != "dense_bytes"}
        counters["dense_bytes"] = counters["calls"] * self.numel * self._dtype.size
        return counters


def _name_of(variable):
    """A Keras 3 variable's path ("dense/kernel"), else the TF name without ":0"."""
    name = getattr(variable, "path", None) or variable.name
    return name[:-2] if name.endswith(":0") else name


def _unique(name, taken):
    """`name`, or the first of name_1, name_2, ... not in `taken`; adds it to `taken`."""
    unique, suffix = name, 0
    while unique in taken:
        suffix += 1
        unique = f"{name}_{suffix}"
    taken.add(unique)
    return unique


def _trace_of(tensor):
    """The outermost tf.function graph `tensor` was traced in (None when eager): compress
    calls of one trace form one round of attribution, whatever cond branches they sit in."""
    if tf.executing_eagerly() or not hasattr(tensor, "graph"):
        return None
    graph = tensor.graph
    while hasattr(getattr(graph, "outer_graph", None), "outer_graph"):  # a FuncGraph nested in a FuncGraph
        graph = graph.outer_graph
    return graph


class VariableBinding:
    """The bound variables of one compressor, in order, and gradient attribution."""

    def __init__(self, owner, variables):
        self.owner = owner
        if isinstance(variables, (tf.Module, tf.Variable)) or hasattr(variables, "trainable_variables"):
            raise TypeError(
                f"{owner}: variables should be a list of variables or (name, variable) pairs such as "
                f"model.trainable_variables, got {type(variables).__name__}"
            )
        self.names, self.variables, self.shapes, self.dtypes = [], [], [], []
        items = [item if isinstance(item, tuple) else (None, item) for item in variables]
        taken = {name for name, _ in items if isinstance(name, str)}  # names given in pairs stay as given
        for name, variable in items:
            if not (hasattr(variable, "shape") and hasattr(variable, "dtype") and hasattr(variable, "assign")):
                raise TypeError(
                    f"{owner}: variables should hold TF/Keras variables or (name, variable) pairs, got {variable!r:.80}"
                )
            if any(v is variable for v in self.variables):
                raise ValueError(f"{owner}: the variable {name or _name_of(variable)!r} is listed twice")
            if name is None:
                name = _unique(_name_of(variable), taken)
            elif not isinstance(name, str):
                raise TypeError(f"{owner}: a variable's name should be a str, got {name!r}")
            elif name in self.names:
                raise ValueError(
                    f"{owner}: two (name, variable) pairs are named {name!r}; names given in pairs should be unique"
                )
            shape, dtype = tf.TensorShape(variable.shape), tf.as_dtype(variable.dtype)
            if not shape.is_fully_defined():
                raise ValueError(f"{owner}: variable {name!r} should have a static shape, got {shape}")
            self.names.append(name)
            self.variables.append(variable)
            self.shapes.append(shape)
            self.dtypes.append(dtype)
        if not self.names:
            raise ValueError(f"{owner}: variables is empty (build the model before binding its variables)")
        self._rounds = weakref.WeakKeyDictionary()  # trace graph -> positions attributed in it
        self._eager_round = set()
        self._expected = None

    @contextlib.contextmanager
    def expect(self, variable):
        """Within the block, gradients are attributed to `variable` (exact attribution, for
        front ends that know the variable, such as sparsecomm.tensorflow.keras)."""
        position = next((i for i, v in enumerate(self.variables) if v is variable), None)
        if position is None:
            raise LookupError(f"{self.owner}: the variable {_name_of(variable)!r} is not among the bound variables")
        previous, self._expected = self._expected, position
        try:
            yield
        finally:
            self._expected = previous

    def attribute(self, grad):
        """The position of the bound variable `grad` belongs to (see the module docstring)."""
        fits = lambda i: grad.shape.is_compatible_with(self.shapes[i]) and grad.dtype == self.dtypes[i]  # noqa: E731
        if self._expected is not None:
            if not fits(self._expected):
                raise ValueError(
                    f"{self.owner}: the gradient of {self.names[self._expected]!r} should have shape "
                    f"{self.shapes[self._expected]} and dtype {self.dtypes[self._expected].name}, got "
                    f"{grad.shape} {grad.dtype.name}"
                )
            return self._expected
        trace = _trace_of(grad)
        used = self._eager_round if trace is None else self._rounds.setdefault(trace, set())
        for fresh_round in (False, True):
            if fresh_round:
                used.clear()  # every variable had its gradient: a new step (eager) or a second reduction
            for i in range(len(self.names)):
                if i not in used and fits(i):
                    used.add(i)
                    return i
            if not used:
                break
        listed = ", ".join(f"{n} {s} {d.name}" for n, s, d in zip(self.names[:8], self.shapes, self.dtypes))
        raise LookupError(
            f"{self.owner}: got a gradient of shape {grad.shape} and dtype {grad.dtype.name} that fits none of the "
            f"bound variables ({listed}{', ...' if len(self.names) > 8 else ''}). Bind the variables whose "
            f"gradients are reduced: variables=model.trainable_variables, the same list as the tape's sources."
        )


_FLOAT_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def checked_gradient(owner, tensor, binding):
    """Refuses what a compressor cannot take: any gradient before it is bound to variables,
    IndexedSlices, and gradients not in a float dtype."""
    if binding is None:
        raise RuntimeError(
            f"{owner} keeps per-variable state and needs variables=: construct it as "
            f"{owner}(..., variables=model.trainable_variables)"
        )
    if isinstance(tensor, tf.IndexedSlices):
        raise TypeError(
            f"{owner}: got tf.IndexedSlices; Horovod gathers those without compression "
            f"(or densify them with sparse_as_dense=True)"
        )
    dtype = getattr(tensor, "dtype", None)
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{owner}: gradients should be float32, float16 or bfloat16, got "
            f"{getattr(dtype, 'name', type(tensor).__name__)}"
        )


def stats(states, choices):
    """stats() of a compressor's states: totals and, per variable, its counters, numel, density
    and the exchange chosen (`choices`, the planner's)."""
    tensors = {
        state.variable_name: report.tensor_stats(state.counters(), state.numel, choices.get(state.variable_name))
        for state in states
    }
    return dict(report.totals(tensors), tensors=tensors)


def states_for(binding, planner, method, scaled):
    """A VariableState per bound variable, created outside any trace (a variable too large to be
    sent sparse is refused here, before its residual is allocated)."""
    states = []
    with tf.init_scope():
        for name, shape, dtype in zip(binding.names, binding.shapes, binding.dtypes):
            planner.check_indexable(name, shape.num_elements(), shape.rank, dtype.size)
            sparse = not planner.always_dense(name, shape.num_elements(), shape.rank, dtype.size)
            states.append(
                VariableState(
                    name,
                    shape,
                    dtype,
                    residual=sparse and method.keeps_residual,
                    momentum=method.keeps_momentum,
                    scaled=scaled,
                )
            )
    return states


def shared_steps(states):
    """What every rank must hold alike (sparsecomm.core.agreement), read eagerly even inside a trace."""
    with tf.init_scope():
        return {state.variable_name: {"step": int(state.step.numpy())} for state in states}


def adopt_steps(states, shared):
    with tf.init_scope():
        for state in states:
            if state.variable_name in shared:
                state.step.assign(shared[state.variable_name]["step"])
