"""Tensor-parallel rollout, the parts that run without an engine: ranks grouped into engines, the
prompts each engine (and so each of its ranks) gets, whose outputs are kept, the rendezvous each rank
is given, the engines' seeds, and validation. The engine itself (two processes holding one vLLM
engine, full tensors in at the weight sync) is tested in tests/e2e/test_rollout_vllm.py and through
the command line in tests/e2e/test_train_e2e.py."""

from __future__ import annotations

import pytest

from grpo_dist.config.schema import ConfigError
from grpo_dist.config.spec import resolve
from grpo_dist.rollout.assemble import shard_prompts
from grpo_dist.rollout.base import SamplingSettings
from grpo_dist.rollout.tp import engine_of, engine_outputs, engine_shares, init_args, tp_groups
from grpo_dist.trainer import roles
from tests.configs import cfg_of

R = "actor_rollout_ref.rollout."


def test_ranks_are_grouped_consecutively():
    assert tp_groups(8, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert tp_groups(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert tp_groups(3, 1) == [[0], [1], [2]]
    assert [engine_of(r, 4) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError):
        tp_groups(6, 4)


def test_every_rank_of_an_engine_gets_the_engines_prompts_and_one_output_is_kept():
    sampling = SamplingSettings(n=2, temperature=1.0, max_tokens=4, seed=100)
    prompts = [[i] for i in range(6)]
    shares = shard_prompts(prompts, 2, sampling)  # 4 ranks, tp 2: 2 engines, 3 prompts each
    per_rank = engine_shares(shares, 2)
    assert [p for p, _ in per_rank] == [[[0], [1], [2]]] * 2 + [[[3], [4], [5]]] * 2
    assert [s.seed for _, s in per_rank] == [100, 100, 106, 106]  # prompt 3 keeps the seed of its position
    assert engine_outputs(["a0", "a1", "b0", "b1"], 2) == ["a0", "b0"]
    with pytest.raises(ValueError):
        engine_outputs(["a0", "a1", "b0"], 2)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_prompts_and_seeds_do_not_depend_on_the_number_of_engines(tp):
    """Every prompt is sampled with the seed of its position in the step, whatever the tensor parallelism,
    so the step's responses are the same with 4 engines of 1 rank and 1 engine of 4."""
    sampling = SamplingSettings(n=3, temperature=1.0, max_tokens=4, seed=7)
    prompts = [[i, i + 1] for i in range(10)]
    per_engine = engine_outputs(engine_shares(shard_prompts(prompts, 4 // tp, sampling), tp), tp)
    seen = [(tuple(p), s.seed + k * s.n) for ps, s in per_engine for k, p in enumerate(ps)]
    assert seen == [(tuple(p), 7 + i * 3) for i, p in enumerate(prompts)]


def test_each_rank_meets_its_engines_first_rank():
    offers = [("h0", 100), ("h0", 101), ("h0", 102), ("h0", 103), ("h1", 200), ("h1", 201), ("h1", 202), ("h1", 203)]
    assert init_args(offers, 2) == [(0, "h0", 100), (1, "h0", 100), (0, "h0", 102), (1, "h0", 102),
                                    (0, "h1", 200), (1, "h1", 200), (0, "h1", 202), (1, "h1", 202)]
    assert init_args(offers, 4)[5] == (1, "h1", 200)


class FakeGroup:
    """Records what the rollout role's set-up asks of its ranks."""

    def __init__(self, offers):
        self.offers, self.submitted = offers, []

    def call(self, method, *args, **kwargs):
        assert method == "address"
        return list(self.offers)

    def submit(self, method, *args, per_rank=None, **kwargs):
        self.submitted.append((method, per_rank))
        return ["ref"] * len(per_rank)


def test_rollout_role_builds_tensor_parallel_engines_together():
    cfg = cfg_of(R + "tensor_model_parallel_size=2", "trainer.n_gpus_per_node=4", R + "seed=10")
    ctx = roles.RoleContext(resolve(cfg), "cpu", "/m", "/m", 10, 4, 1)
    kwargs = [roles._rollout_kwargs(ctx, r) for r in range(4)]
    assert [k["tp"] for k in kwargs] == [2] * 4
    assert [k["engine_kwargs"]["seed"] for k in kwargs] == [10, 10, 11, 11]  # one seed per engine
    assert all(k["engine_kwargs"]["tensor_parallel_size"] == 2 for k in kwargs)
    group = FakeGroup([("h", 5000 + r) for r in range(4)])
    assert roles._rollout_setup(ctx, group) == ["ref"] * 4
    assert group.submitted == [("init_engine", [(0, "h", 5000), (1, "h", 5000), (0, "h", 5002), (1, "h", 5002)])]
    # one engine per rank: built by the constructor, nothing to set up
    one = roles.RoleContext(resolve(cfg_of("trainer.n_gpus_per_node=2")), "cpu", "/m", "/m", 10, 2, 1)
    assert roles._rollout_setup(one, FakeGroup([])) == []
    assert [roles._rollout_kwargs(one, r)["engine_kwargs"]["seed"] for r in range(2)] == [0, 1]


def test_tensor_parallel_validation():
    cfg = cfg_of(R + "tensor_model_parallel_size=4", "trainer.n_gpus_per_node=8", "trainer.nnodes=2")
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 4
    with pytest.raises(ConfigError, match="must be divisible by it; valid: 1, 2, 4"):
        cfg_of(R + "tensor_model_parallel_size=8", "trainer.n_gpus_per_node=4", "trainer.nnodes=2")
    with pytest.raises(ConfigError, match="needs rollout.name=vllm"):
        cfg_of(R + "tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2", R + "name=hf")


def test_cpu_shared_memory_is_named_per_group_and_a_dead_runs_file_is_removed(monkeypatch, tmp_path):
    """vLLM names its CPU all-reduce memory from the init method, constant under the external launcher:
    a file left by a killed run made every later tensor-parallel engine on the host fail (errno 17)."""
    pytest.importorskip("vllm")
    import types

    from vllm.distributed.device_communicators import cpu_communicator as cc

    from grpo_dist.rollout import vllm_engine

    monkeypatch.setattr(cc._CPUSHMDistributed, "make_group_name", cc._CPUSHMDistributed.make_group_name)
    monkeypatch.setattr(vllm_engine, "_SHM_DIR", tmp_path)
    monkeypatch.setenv("VLLM_DIST_IDENT", "//")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(var, "")  # restored after the test: tp_launcher_env writes them
    comm = types.SimpleNamespace(unique_name="tp:0", ranks=[0, 1], rank=1)
    vllm_engine.tp_launcher_env(2, 1, ("127.0.0.1", 29511), on_gpu=False)
    name = cc._CPUSHMDistributed.make_group_name(comm)
    assert "29511" in name and "/" not in name
    stale = tmp_path / f"{name}_1"
    stale.write_bytes(b"left by a killed run")
    other_rank = tmp_path / f"{name}_0"
    other_rank.write_bytes(b"rank 0's own")
    assert cc._CPUSHMDistributed.make_group_name(comm) == name
    assert not stale.exists() and other_rank.exists()  # each rank clears only its own file
    vllm_engine.tp_launcher_env(2, 1, ("127.0.0.1", 29512), on_gpu=False)  # patched once, not stacked
    assert cc._CPUSHMDistributed.make_group_name(comm) == name.replace("29511", "29512")
