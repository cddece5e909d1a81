"""Autograph leaves Horovod's functions as written, as it leaves TensorFlow's and Keras's.

Horovod writes its TF code for TF1 graphs too, where autograph never runs: every branch on a
tensor is a ``tf.cond``. Inside a ``tf.function``, autograph rewrote those functions all the
same, which changed no op of the graph and cost most of a process's first traced step
(docs/tensorflow.md, "Things to know"). ``SPARSECOMM_AUTOGRAPH_HOROVOD=1`` keeps them converted."""

import os

MODULE = "horovod"
KEEP_CONVERTING = "SPARSECOMM_AUTOGRAPH_HOROVOD"


def leave_horovod_unconverted():
    """Adds Horovod to the modules autograph does not convert, once a process; returns whether
    it is among them. The rules are TF's own list (its tests extend it the same way)."""
    if os.environ.get(KEEP_CONVERTING) == "1":
        return False
    try:
        from tensorflow.python.autograph.core import config

        rules = tuple(config.CONVERSION_RULES)
        if not any(isinstance(rule, config.DoNotConvert) and rule.matches(MODULE) for rule in rules):
            config.CONVERSION_RULES = (config.DoNotConvert(MODULE),) + rules
    except (ImportError, AttributeError):  # another TF layout: autograph converts Horovod, as before
        return False
    return True
