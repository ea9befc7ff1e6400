"""Flat-bucket weight sync: bucket planning and the pack/unpack round trip (CPU)."""

from __future__ import annotations

import pytest
import torch

from grpo_dist.rollout.weight_sync import Bucket, pack, plan_buckets, unpack


def _meta(sd):
    return [(k, tuple(v.shape), v.dtype) for k, v in sd.items()]


def test_buckets_keep_order_respect_the_size_limit_and_split_by_dtype():
    sd = {
        "a": torch.zeros(10, 10),  # 400 B
        "b": torch.zeros(20),  # 80 B
        "c": torch.zeros(100, dtype=torch.bfloat16),  # 200 B, other dtype: new bucket
        "d": torch.zeros(50, 10),  # 2000 B > limit: a bucket of its own
        "e": torch.zeros(5),  # 20 B
    }
    buckets = plan_buckets(_meta(sd), bucket_bytes=500)
    assert [[e.name for e in b.entries] for b in buckets] == [["a", "b"], ["c"], ["d"], ["e"]]
    assert [b.dtype for b in buckets] == ["float32", "bfloat16", "float32", "float32"]
    assert buckets[0].entries[1].offset == 100 and buckets[0].numel == 120 and buckets[0].nbytes == 480
    assert [e.name for b in buckets for e in b.entries] == list(sd)


def test_pack_then_unpack_gives_back_every_tensor_exactly():
    g = torch.Generator().manual_seed(0)
    sd = {"w1": torch.randn(3, 4, generator=g), "w2": torch.randn(7, generator=g), "w3": torch.randn(2, 2, 2, generator=g)}
    (bucket,) = plan_buckets(_meta(sd), bucket_bytes=1 << 20)
    flat = pack(bucket, sd, "cpu")
    assert flat.shape == (12 + 7 + 8,)
    out = dict(unpack(bucket, flat))
    assert list(out) == list(sd)
    for k in sd:
        assert torch.equal(out[k], sd[k])


def test_pack_casts_to_the_bucket_dtype():
    sd = {"w": torch.tensor([1.0, 2.5, -3.0])}
    bucket = Bucket("bfloat16", plan_buckets(_meta(sd), 1024)[0].entries)
    flat = pack(bucket, sd, "cpu")
    assert flat.dtype == torch.bfloat16 and flat.tolist() == [1.0, 2.5, -3.0]


def test_mismatches_are_named():
    sd = {"w": torch.zeros(4)}
    (bucket,) = plan_buckets(_meta(sd), 1024)
    with pytest.raises(ValueError, match="w has shape"):
        pack(bucket, {"w": torch.zeros(5)}, "cpu")
    with pytest.raises(ValueError, match="does not match the bucket"):
        list(unpack(bucket, torch.zeros(5)))
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(_meta(sd), 0)


def test_object_store_bytes_view_back_without_a_copy():
    from grpo_dist.rollout.weight_sync import bucket_buffer

    sd = {"a": torch.randn(3, 5), "b": torch.randn(4)}
    (bucket,) = plan_buckets(_meta(sd), 1 << 20)
    flat = pack(bucket, sd, "cpu")
    raw = flat.view(torch.uint8).numpy()
    raw.setflags(write=False)  # as Ray hands it out
    back = bucket_buffer(bucket, raw)
    assert back.data_ptr() == flat.data_ptr()
    assert all(torch.equal(v, sd[k]) for k, v in unpack(bucket, back))
    with pytest.raises(ValueError, match="bytes"):
        bucket_buffer(bucket, raw[:-4])
