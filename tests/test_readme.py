"""The README's usage snippets run as written, under horovodrun -np 2, each followed by one
step that uses what it set up."""
import os
import re

import pytest

from launch import horovodrun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVERS = {
    "horovod.torch": """
x = torch.randn(8, 1024)
opt.zero_grad(); model(x).square().sum().backward(); opt.step()
assert compression.stats()["calls"] == 2
print("torch snippet ok", hvd.rank())
""",
    "horovod.tensorflow": """
dense = exchange(tf.ones([1000]) * (hvd.rank() + 1), 0)
assert int(tf.math.count_nonzero(dense)) == 10 and float(tf.reduce_max(dense)) == (hvd.size() + 1) / 2
print("tf snippet ok", hvd.rank())
""",
}


def snippets():
    with open(os.path.join(ROOT, "README.md")) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


@pytest.mark.parametrize("framework", list(DRIVERS))
def test_readme_snippet_runs(framework, tmp_path):
    (code,) = [s for s in snippets() if f"import {framework} as hvd" in s]
    script = tmp_path / f"readme_{framework.split('.')[1]}.py"
    script.write_text(code + DRIVERS[framework])
    output = horovodrun(2, script)
    assert output.count("snippet ok") == 2, output[-3000:]
