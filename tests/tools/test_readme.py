"""The README's usage snippets run as written, under horovodrun -np 2 (the DDP one under
torchrun --nproc_per_node 2, the FSDP one under torchrun --nproc_per_node 4: 2 replicas of 2
shards), each followed by one step that uses what it set up."""

import os
import re

import pytest
from launch import horovodrun, torchrun
from paths import ROOT

# the snippet's distinctive line -> what runs after it
DRIVERS = {
    "import horovod.torch as hvd": """
x = torch.randn(8, 1024)
opt.zero_grad(); model(x).square().sum().backward(); opt.step()
assert compression.stats()["calls"] == 2
print("torch snippet ok", hvd.rank())
""",
    "hvd.DistributedGradientTape": """
for step in range(3):
    train_step(tf.random.normal([8, 1024], seed=hvd.rank()), tf.zeros([8], tf.int64))
stats = compression.stats()
assert stats["calls"] == 3 * 2 and 0 < stats["sent_bytes"] <= stats["dense_bytes"], stats  # "auto" may pick dense
assert list(stats["tensors"]) == ["Variable", "Variable_1"], stats  # w and b: both unnamed
same = hvd.allgather(tf.reshape(w, [1, -1]))
assert bool(tf.reduce_all(same[0] == same[1]))
print("tf snippet ok", hvd.rank())
""",
    "sckeras.DistributedOptimizer": """
import numpy as np
x = np.random.default_rng(hvd.rank()).random((64, 64)).astype("float32")
model.fit(x, np.arange(64) % 10, batch_size=16, epochs=2, callbacks=callbacks, verbose=0)
assert compression.stats()["calls"] == 8 * 4, compression.stats()  # 4 variables, 8 steps
same = hvd.allgather(tf.reshape(model.trainable_variables[0], [1, -1]))
assert bool(tf.reduce_all(same[0] == same[1]))
print("keras snippet ok", hvd.rank())
""",
}
DDP_MARKER = "sct.ddp_hook"
DDP_TEARDOWN = "sct.destroy_process_group()"
DDP_DRIVER = """
x = torch.randn(8, 1024)
opt.zero_grad(); ddp(x).square().sum().backward(); opt.step()
assert compression.stats()["calls"] == 4, compression.stats()  # 2 weights, 2 biases
mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = [torch.empty_like(mine) for _ in range(2)]
dist.all_gather(everyone, mine)
assert torch.equal(everyone[0], everyone[1])
print("ddp snippet ok", dist.get_rank())
"""
FSDP_MARKER = "sct.register_fsdp_hook"
FSDP_DRIVER = """
x = torch.randn(8, 1024)
opt.zero_grad(); model(x).square().sum().backward(); opt.step()
assert compression.stats()["calls"] == 4, compression.stats()  # each rank's shards of 2 weights, 2 biases
mine = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])
everyone = [torch.empty_like(mine) for _ in range(4)]
dist.all_gather(everyone, mine)
assert all(torch.equal(everyone[0], other) for other in everyone[1:])  # the replicas agree
print("fsdp snippet ok", dist.get_rank())
"""


def snippets():
    with open(os.path.join(ROOT, "README.md")) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


@pytest.mark.parametrize("marker", list(DRIVERS), ids=["torch", "tf-tape", "keras3"])
def test_readme_snippet_runs(marker, tmp_path):
    (code,) = [s for s in snippets() if marker in s]
    script = tmp_path / "readme_snippet.py"
    script.write_text(code + "\nimport tensorflow as tf\n" * ("tensorflow" in code) + DRIVERS[marker])
    output = horovodrun(2, script)
    assert output.count("snippet ok") == 2, output[-3000:]


def test_readme_ddp_snippet_runs(tmp_path):
    (code,) = [s for s in snippets() if DDP_MARKER in s]
    setup, teardown = code.split(DDP_TEARDOWN)  # the step runs before the snippet's own last line
    script = tmp_path / "readme_ddp_snippet.py"
    script.write_text(setup + DDP_DRIVER + DDP_TEARDOWN + teardown)
    output = torchrun(2, script)
    assert output.count("ddp snippet ok") == 2, output[-3000:]


def test_readme_fsdp_snippet_runs(tmp_path):
    (code,) = [s for s in snippets() if FSDP_MARKER in s]
    setup, teardown = code.split(DDP_TEARDOWN)
    script = tmp_path / "readme_fsdp_snippet.py"
    script.write_text(setup + FSDP_DRIVER + DDP_TEARDOWN + teardown)
    output = torchrun(4, script)
    assert output.count("fsdp snippet ok") == 4, output[-3000:]
