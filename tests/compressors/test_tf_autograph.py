"""Autograph leaves Horovod's functions as written (sparsecomm/tensorflow/autograph.py): the rule
is in place once sparsecomm.tensorflow is imported, it reaches Horovod alone, the switch keeps
Horovod converted, and a step traced either way holds the same ops."""

import json
import os
import subprocess
import sys

import pytest
from paths import WORKERS

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
hvd = pytest.importorskip("horovod.tensorflow")
from tensorflow.python.autograph.core import config  # noqa: E402
from tensorflow.python.autograph.impl import conversion  # noqa: E402

import sparsecomm.tensorflow as sctf  # noqa: E402
from sparsecomm.tensorflow import autograph  # noqa: E402


def _horovod_rule(rule):
    return isinstance(rule, config.DoNotConvert) and rule.matches("horovod")


def _without_horovod_rule():
    return tuple(rule for rule in config.CONVERSION_RULES if not _horovod_rule(rule))


def test_importing_the_package_leaves_horovod_alone_unconverted():
    def users_step():
        return 1

    assert conversion.is_allowlisted(hvd.allreduce) and conversion.is_allowlisted(hvd.DistributedGradientTape)
    assert not conversion.is_allowlisted(users_step)  # the user's own code is converted as before
    assert not conversion.is_allowlisted(sctf.TopK.__init__)  # nor is sparsecomm's
    assert len([rule for rule in config.CONVERSION_RULES if _horovod_rule(rule)]) == 1  # once, imported twice
    assert autograph.leave_horovod_unconverted() and len(_without_horovod_rule()) == len(config.CONVERSION_RULES) - 1


def test_the_switch_keeps_horovod_converted(monkeypatch):
    monkeypatch.setattr(config, "CONVERSION_RULES", _without_horovod_rule())
    monkeypatch.setenv(autograph.KEEP_CONVERTING, "1")
    assert autograph.leave_horovod_unconverted() is False
    assert not conversion.is_allowlisted(hvd.allreduce)
    monkeypatch.delenv(autograph.KEEP_CONVERTING)
    assert autograph.leave_horovod_unconverted() and conversion.is_allowlisted(hvd.allreduce)


def _traced():
    """tests/workers/tf_traced_ops.py's line with Horovod left as written and converted, each in a
    process of its own (autograph keeps a function it once found unconverted so), side by side."""
    worker = [sys.executable, os.path.join(WORKERS, "tf_traced_ops.py")]
    procs = [
        subprocess.Popen(worker, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for env in (dict(os.environ, **{autograph.KEEP_CONVERTING: flag}) for flag in ("0", "1"))
    ]
    said = [proc.communicate(timeout=300) for proc in procs]
    for proc, (_, err) in zip(procs, said):
        assert proc.returncode == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in said]


def test_a_step_traced_with_horovod_converted_or_not_holds_the_same_ops():
    as_written, converted = _traced()
    assert as_written.pop("horovod_unconverted") is True and converted.pop("horovod_unconverted") is False
    assert as_written == converted
    assert as_written["dense"]["HorovodAllreduce"] == 1 and as_written["dgc"]["HorovodAllgather"] >= 1
