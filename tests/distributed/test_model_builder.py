"""build_fsdp_model builds other model roles the same way: a value model (token classification with
one label) from the policy's checkpoint, frozen or trainable, sharded with FSDP2 (gloo, 1 rank)."""

from __future__ import annotations

import pytest
import torch

from tests.distributed._dist_helpers import make_batch, run_ranks


def job(rank: int, world_size: int, model_dir: str) -> dict:
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForTokenClassification

    from grpo_dist.distributed.process_group import make_device_mesh
    from grpo_dist.training.model_builder import build_fsdp_model

    data = make_batch(31, rows=4)
    inputs = {k: data[k] for k in ("input_ids", "attention_mask", "position_ids")}
    mesh = make_device_mesh(world_size, "cpu")
    out: dict = {}
    for trainable in (False, True):
        torch.manual_seed(5)  # the value head is not in the checkpoint: it is initialised at random
        model = build_fsdp_model(
            model_dir,
            mesh=mesh,
            device=torch.device("cpu"),
            model_dtype="float32",
            param_dtype="float32",
            reduce_dtype="float32",
            trainable=trainable,
            model_class=AutoModelForTokenClassification,
            config_overrides={"num_labels": 1},
        )
        with torch.no_grad():
            values = model(**inputs).logits
        out[trainable] = {
            "values": values,
            "requires_grad": sorted({p.requires_grad for p in model.parameters()}),
            "all_dtensor": all(isinstance(p, DTensor) for p in model.parameters()),
            "training": model.training,
            "class": type(model).__name__,
        }
    torch.manual_seed(5)
    plain = AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32).eval()
    with torch.no_grad():
        out["plain"] = plain(**inputs).logits
    return out


@pytest.fixture(scope="module")
def built(fsdp_model_dir):
    return run_ranks(job, 1, str(fsdp_model_dir))[0]


@pytest.mark.parametrize("trainable", [False, True])
def test_value_model_is_built_sharded_and_matches_plain_transformers(built, trainable):
    r = built[trainable]
    assert r["class"].endswith("ForTokenClassification")
    assert r["values"].shape == (4, 14, 1)
    assert r["all_dtensor"], "every parameter should be sharded by FSDP2"
    assert r["requires_grad"] == [trainable]
    assert not r["training"]
    assert (r["values"] - built["plain"]).abs().max().item() < 1e-5
