"""What every rank of a job must share, checked in one collective and repaired or refused.

Two things must agree for the ranks to train one model:
- settings: the compressor's arguments (its settings text);
- shared state: per tensor, the step. The step drives DGC's warm-up stage and the draws of
  RandomBlock, RandomK and RTopK, so ranks at different steps pick different coordinates.
Each rank sends its settings text, a digest of its shared state and whether it saw a reset.
Only when the digests differ is the shared state itself gathered (a second collective):
- after an elastic reset (any rank saw one), every rank adopts rank 0's shared state, as
  Horovod's own states adopt rank 0's model;
- otherwise (first step, after load_state_dict) nothing can tell which rank is right, so
  every rank raises the same error, naming the tensor, the field and each rank's value.

`allgather(ints, part) -> every rank's ints, concatenated in rank order` is one collective
of the framework, named with `part`.
"""

import hashlib
import json


def check(owner, settings, shared, reset, allgather):
    """Returns rank 0's shared state where this rank must adopt it (a repair), else None.
    settings: this rank's settings text; shared: {tensor: {field: value}}; reset: whether
    this rank saw an elastic reset since the last check."""
    mine = [settings, digest(shared), bool(reset)]
    claims = [json.loads(text) for text in gather_texts(json.dumps(mine), allgather, "settings")]
    texts = [claim[0] for claim in claims]
    if len(set(texts)) > 1:
        listed = "; ".join(f"rank {r}: {t}" for r, t in enumerate(texts))
        raise ValueError(
            f"{owner}: compressor settings differ across ranks ({listed}). "
            f"Every rank must construct the compressor with the same arguments."
        )
    if len({claim[1] for claim in claims}) == 1:
        return None
    everyone = [json.loads(text) for text in gather_texts(json.dumps(shared, sort_keys=True), allgather, "state")]
    if any(claim[2] for claim in claims):
        return everyone[0] if everyone[0] != shared else None
    raise ValueError(disagreement(owner, everyone))


def digest(shared):
    """A short digest of a shared state, the same on every rank that holds the same state."""
    return hashlib.sha256(json.dumps(shared, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def disagreement(owner, everyone):
    """The error text for ranks whose shared states differ: the first tensor and field that
    differ, with each rank's value, and how many tensors differ in all."""
    names = sorted(set().union(*everyone))
    differing = [name for name in names if len({json.dumps(s.get(name), sort_keys=True) for s in everyone}) > 1]
    name = differing[0]
    fields = sorted(set().union(*(s.get(name) or {} for s in everyone)))
    field = next(f for f in fields if len({json.dumps((s.get(name) or {}).get(f)) for s in everyone}) > 1)
    values = ", ".join(f"rank {r}: {(s.get(name) or {}).get(field, 'absent')}" for r, s in enumerate(everyone))
    more = f" (and {len(differing) - 1} more tensors)" if len(differing) > 1 else ""
    return (
        f"{owner}: the ranks' compressor state differs: tensor {name!r}, {field}: {values}{more}. "
        f"Ranks at different steps pick different coordinates and would train different models. "
        f"Load the same checkpoint on every rank (each rank its own compressor state_dict, saved at "
        f"the same step), or none."
    )


def gather_texts(text, allgather, part):
    """Every rank's `text`, in rank order (two collectives: the lengths, then the bytes)."""
    mine = list(text.encode("utf-8"))
    lengths = allgather([len(mine)], f"{part}.length")
    joined, texts = allgather(mine, f"{part}.text"), []
    for length in lengths:
        texts.append(bytes(joined[:length]).decode("utf-8"))
        joined = joined[length:]
    return texts
