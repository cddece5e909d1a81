"""The digits the suite saves once a session (tests/conftest.py, common.save_digits): a process
the suite starts reads scikit-learn's digits from that file, without importing scikit-learn."""

import os
import subprocess
import sys

import common
import numpy as np
from sklearn.datasets import load_digits

PROBE = """
import sys
sys.path.insert(0, {workers!r})
import common, numpy as np
x, y = common.digits()
np.savez({out!r}, x=x, y=y)
print("sklearn" in sys.modules)
"""


def test_a_child_process_reads_scikit_learns_digits_from_the_saved_file(tmp_path):
    assert os.environ.get(common.DIGITS_FILE)
    out = tmp_path / "seen.npz"
    code = PROBE.format(workers=os.path.dirname(common.__file__), out=str(out))
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert imported.strip() == "False"
    x, y = load_digits(return_X_y=True)
    with np.load(out) as seen:
        assert seen["x"].dtype == np.float32 and seen["y"].dtype == np.int64
        np.testing.assert_array_equal(seen["x"], (x / 16.0).astype(np.float32))
        np.testing.assert_array_equal(seen["y"], y)
