"""CPU ranks are checked against the machine's cores before anything starts."""

from __future__ import annotations

import pytest

from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.preflight import check_cpu_ranks


def cfg(*overrides):
    return to_typed(compose(list(overrides)), list(overrides))


def test_more_cpu_ranks_than_cores_is_refused_with_what_fits():
    c = cfg("trainer.device=cpu", "trainer.n_gpus_per_node=64")
    with pytest.raises(ValueError, match=r"= 64 CPU ranks, but this machine has 2 cores.*trainer.n_gpus_per_node=2"):
        check_cpu_ranks(c, 2)


def test_ranks_that_fit_and_cluster_runs_pass():
    check_cpu_ranks(cfg("trainer.device=cpu", "trainer.n_gpus_per_node=2"), 2)
    check_cpu_ranks(cfg("trainer.device=cpu", "trainer.n_gpus_per_node=64", "ray_kwargs.ray_init.address=auto"), 2)
    check_cpu_ranks(cfg("trainer.device=cpu", "trainer.n_gpus_per_node=64"), None)


# ---- memory: a floor from the model's size against the memory available ---------------------------
GIB = 2**30


def hand_floor_gib(params, ranks, *, kv=1.0, reference=True):
    """The floor written out by hand for float32 (4 bytes): actor 16 B/param (sharded: counted once),
    reference 4 B/param, every rank's engine 4 B/param + its KV cache, 0.35 GiB per process
    (actor, rollout, reference per rank; the driver and the reward worker)."""
    processes = ranks * (3 if reference else 2) + 2
    return (16 * params + (4 * params if reference else 0) + ranks * 4 * params) / GIB + ranks * kv + 0.35 * processes


def test_memory_floor_matches_the_hand_count():
    from grpo_dist.config.memory import cpu_memory_estimate

    c = cfg("trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.use_kl_loss=true")
    got, parts = cpu_memory_estimate(c, 2, params=500_000_000)
    assert got == pytest.approx(hand_floor_gib(500_000_000, 2))
    assert "actor" in parts and "reference" in parts and "KV cache" in parts
    hf = cfg("trainer.device=cpu", "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.use_kl_loss=false")
    assert cpu_memory_estimate(hf, 1, params=10**9)[0] == pytest.approx(hand_floor_gib(10**9, 1, kv=0, reference=False))


def test_memory_floor_under_lora_counts_the_frozen_base_once_and_no_reference_copy():
    """LoRA: the base has no gradients or Adam state, and the reference is the actor's model with the
    adapters off (no weights of its own); the rollout engines and the processes are as without LoRA."""
    from grpo_dist.config.memory import cpu_memory_estimate

    c = cfg("trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.model.lora_rank=8")
    got, parts = cpu_memory_estimate(c, 2, params=500_000_000)
    full = hand_floor_gib(500_000_000, 2)
    assert got == pytest.approx(full - (12 * 500_000_000 + 4 * 500_000_000) / GIB)
    assert "frozen base weights under LoRA" in parts and "reference" not in parts


def test_memory_floor_counts_each_reward_model_and_its_own_pools_processes():
    """Two reward models (reward.sources): the colocated one's weights; the one on a pool of 3 ranks of its
    own, trained by iterative RL, its weights, gradients and Adam, and 3 more processes."""
    from grpo_dist.config.memory import cpu_memory_estimate

    c = cfg("trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.use_kl_loss=true",
            "+reward.sources.a.kind=outcome_model", "+reward.sources.a.path=/rm_a",
            "+reward.sources.b.kind=outcome_model", "+reward.sources.b.path=/rm_b",
            "+reward.sources.b.enable_resource_pool=true", "+reward.sources.b.nnodes=1", "+reward.sources.b.n_gpus_per_node=3",
            "reward_model.iterative.enable=true", "reward_model.iterative.source=b")
    rm = {"reward_model.a": 100_000_000, "reward_model.b": 200_000_000}
    got, parts = cpu_memory_estimate(c, 2, params=500_000_000, reward_model_params=rm)
    want = hand_floor_gib(500_000_000, 2) + (4 * 100_000_000 + 16 * 200_000_000) / GIB + 3 * 0.35
    assert got == pytest.approx(want)
    assert "reward_model.a 0.4" in parts and "reward_model.b 3.0" in parts and "11 processes" in parts


def test_too_little_memory_is_refused_naming_what_fits(monkeypatch):
    from grpo_dist.config import memory, preflight

    c = cfg("trainer.device=cpu", "trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.use_kl_loss=true")
    params = 500_000_000  # 8 ranks: 7.45 + 1.86 + 8 x (1.86 + 1) + 26 x 0.35 = 41.3 GiB
    monkeypatch.setattr(preflight, "machine_cores", lambda: 16)
    monkeypatch.setattr(memory, "available_memory_gib", lambda: 24.0)
    monkeypatch.setattr(memory, "model_parameter_count", lambda path: params)
    with pytest.raises(ValueError) as err:
        memory.check_cpu_resources(c, "/model")
    msg = str(err.value)
    assert "8 CPU rank(s) of a 500 M-parameter model need at least 41.3 GiB" in msg
    assert "24.0 GiB available" in msg
    # the largest count that fits, by hand: 4 ranks = 9.31 + 4 x 2.86 + 14 x 0.35 = 25.7 > 24; 3 ranks = 21.8
    assert hand_floor_gib(params, 4) > 24 > hand_floor_gib(params, 3)
    assert "use at most trainer.n_gpus_per_node=3 here" in msg


def test_close_to_the_memory_available_warns_and_far_below_is_quiet(monkeypatch):
    from grpo_dist.config import memory

    c = cfg("trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.use_kl_loss=true")
    floor = hand_floor_gib(10**9, 2)  # 22.6 GiB
    note = memory.check_cpu_memory(c, 10**9, available_gib=floor / 0.9)
    assert note and "may be killed for memory" in note and "kv_cache_gib" in note
    assert memory.check_cpu_memory(c, 10**9, available_gib=floor / 0.5) is None
    # not checked: unknown sizes, a Ray cluster, a GPU run
    assert memory.check_cpu_memory(c, None, available_gib=1.0) is None
    on_cluster = cfg("trainer.device=cpu", "ray_kwargs.ray_init.address=auto")
    assert memory.check_cpu_memory(on_cluster, 10**9, available_gib=1.0) is None


def test_even_one_rank_that_does_not_fit_says_so():
    from grpo_dist.config import memory

    c = cfg("trainer.device=cpu", "trainer.n_gpus_per_node=2")
    with pytest.raises(ValueError, match="even one rank does not fit"):
        memory.check_cpu_memory(c, 7 * 10**9, available_gib=16.0)


def test_cores_come_from_the_cpu_affinity(monkeypatch):
    import os

    from grpo_dist.config import memory, preflight

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert preflight.machine_cores() == 2
    monkeypatch.setattr(memory, "model_parameter_count", lambda path: None)
    with pytest.raises(ValueError, match="this machine has 2 cores"):
        memory.check_cpu_resources(cfg("trainer.device=cpu", "trainer.n_gpus_per_node=8"), "/model")


def test_parameter_count_from_safetensors_headers(tmp_path):
    import torch
    from safetensors.torch import save_file

    from grpo_dist.config.memory import model_parameter_count

    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16)}, str(tmp_path / "model-1.safetensors"))
    save_file({"c": torch.zeros(2, 2, 2)}, str(tmp_path / "model-2.safetensors"))
    assert model_parameter_count(str(tmp_path)) == 12 + 5 + 8
    assert model_parameter_count(str(tmp_path / "nothing")) is None


# ---- one rule for --check and the run: usable cores (CPU affinity) and threads per rank ---------------------
def test_check_and_run_count_the_cores_of_the_cpu_affinity(monkeypatch):
    """A batch scheduler or taskset narrows the cores a process may use; --check and the run both count
    those (not the machine's), and the run's threads per rank come from the same count."""
    import os

    from grpo_dist import main as main_mod
    from grpo_dist.config import memory, preflight

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(preflight, "cuda_available", lambda: False)
    too_many = cfg("trainer.device=cpu", "trainer.n_gpus_per_node=4")
    assert preflight.usable_cores(too_many) == 2
    with pytest.raises(ValueError, match=r"= 4 CPU ranks, but this machine has 2 cores this process may use"):
        memory.check_cpu_resources(too_many, "unused")  # the run's check

    class Job:  # what --check prints the plan of
        cfg, sweep, num, label, output_dir = too_many, None, 0, "", too_many.trainer.default_local_dir

    assert main_mod.print_plans([Job()], full=True) == 2  # --check refuses it too
    fits = cfg("trainer.device=cpu", "trainer.n_gpus_per_node=2")
    assert preflight.worker_threads(fits, "cpu", 2, cluster_cpus=lambda: 64) == 1  # 2 cores / 2 ranks, not 64 / 2
    assert preflight.worker_threads(cfg("trainer.device=cpu", "trainer.n_gpus_per_node=1"), "cpu", 1, lambda: 64) == 2
    limited = cfg("trainer.device=cpu", "trainer.n_gpus_per_node=2", "ray_kwargs.ray_init.num_cpus=1")
    with pytest.raises(ValueError, match="has 1 cores this process may use"):
        preflight.check_cpu_ranks(limited, preflight.usable_cores(limited))


def test_check_on_a_machine_without_gpus_validates_a_gpu_config_for_its_cluster(monkeypatch, capsys):
    """`--check` of a GPU launch script on a laptop or a login node: trainer.device=cuda is checked for the
    GPUs the config names, with a note; the auto device refuses CPU ranks it cannot hold, saying so."""
    from grpo_dist.main import main
    from grpo_dist.config import preflight
    import grpo_dist.trainer.run as run_module

    monkeypatch.setattr(preflight, "cuda_available", lambda: False)
    monkeypatch.setattr(preflight, "machine_cores", lambda: 2)
    gpu = ["--check", "trainer.nnodes=2", "trainer.n_gpus_per_node=8", "data.train_batch_size=64"]
    assert main(gpu + ["trainer.device=cuda"]) == 0
    out = capsys.readouterr().out
    assert "the configuration is valid" in out
    assert "this machine has no GPU: checked for the cluster the config names" in out and "2 x 8 GPUs" in out
    assert main(gpu) == 2  # trainer.device=auto: CPU ranks here
    err = capsys.readouterr().err
    assert "16 CPU ranks" in err and "trainer.device=cuda" in err and "--check` then validates for its GPUs" in err
    # a real run of trainer.device=cuda where Ray has no GPUs: one message
    with pytest.raises(ValueError, match="the Ray cluster has no GPUs; run it where the GPUs are"):
        run_module.choose_device("cuda", 0)


def test_gpu_pools_that_fit_one_by_one_but_not_together_are_refused_at_once():
    """One 8-GPU node: the training ranks (1 x 8) and a reward model's own pool (1 x 2) each fit, but not
    together; the run says so before placing either (instead of the second pool's placement timing out)."""
    from grpo_dist.distributed.worker_group import ResourcePlan, WorkerError, check_pools_fit

    train = ResourcePlan(1, 8, "cuda")
    rm = ResourcePlan(1, 2, "cuda", keys="reward.sources.judge")
    with pytest.raises(WorkerError) as e:
        check_pools_fit([train, rm], gpus_per_node=[8.0])
    msg = str(e.value)
    assert "need 10 GPUs together" in msg and "trainer.nnodes=1 x trainer.n_gpus_per_node=8" in msg
    assert "reward.sources.judge.n_gpus_per_node=2" in msg and "has 8" in msg
    check_pools_fit([train, rm], gpus_per_node=[8.0, 8.0])  # two nodes: room for both
    check_pools_fit([ResourcePlan(1, 2, "cpu"), ResourcePlan(1, 3, "cpu")], gpus_per_node=[])  # CPU ranks: not GPUs


# ---- memory: LoRA adapters counted from the model's shape -------------------------------------------
def small_shape():
    """hidden 64, 2 layers, 4 query heads and 2 KV heads of 16, MLP 128, vocab 100. Per layer and rank r the
    adapters hold r x (in + out): q 64+64, k 64+32, v 64+32, o 64+64, gate 64+128, up 64+128, down 128+64
    = 1024 r; lm_head 64+100 = 164 r."""
    from grpo_dist.training.memory import ModelShape

    return ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=100, tied=False)


@pytest.mark.parametrize("targets, exclude, want", [
    ("all-linear", None, 2 * 1024 * 8),
    (["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], None, 2 * 1024 * 8),  # current layout's default
    (["q_proj", "v_proj"], None, 2 * (128 + 96) * 8),
    (r".*\.mlp\..*", None, 2 * (192 + 192 + 192) * 8),
    ("all-linear", ["down_proj"], 2 * (1024 - 192) * 8),
    (["lm_head"], None, 164 * 8),
    (["c_attn"], None, 0),  # a name no layer has adds nothing
])
def test_lora_parameter_count_by_hand(targets, exclude, want):
    from grpo_dist.config.memory import lora_parameter_count

    assert lora_parameter_count(small_shape(), 8, targets, exclude) == want
    assert lora_parameter_count(small_shape(), 0, targets, exclude) == 0


def test_lora_parameter_count_is_what_peft_trains(tiny_model_dir):
    """The count from the shape equals the trainable parameters peft adds to the same model (all-linear and
    a list), so the planner's layer names and sizes are transformers' own."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpo_dist.config.engine import model_shape
    from grpo_dist.config.memory import lora_parameter_count

    config = AutoConfig.from_pretrained(tiny_model_dir)
    shape = model_shape(str(tiny_model_dir), False)
    for targets in ("all-linear", ["q_proj", "down_proj"]):
        model = AutoModelForCausalLM.from_config(config)
        peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
        trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        assert lora_parameter_count(shape, 4, targets) == trainable > 0


def test_memory_floor_counts_the_policys_adapters_and_their_engine_copy():
    """Rank 8 on all linear layers (16 384 parameters): weights, gradients and Adam's two moments (16 B each
    in float32) on the actor, plus one copy (4 B) in each of the 2 rollout engines when the adapters are
    synced alone (lora.merge=false, the default); merged, the engines hold the base's shape only."""
    from grpo_dist.config.memory import cpu_memory_estimate

    base = ("trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.model.lora_rank=8")
    without, _ = cpu_memory_estimate(cfg(*base), 2, params=500_000_000)
    adapters = 2 * 1024 * 8
    got, parts = cpu_memory_estimate(cfg(*base), 2, params=500_000_000, shape=small_shape())
    assert got - without == pytest.approx((16 * adapters + 2 * 4 * adapters) / GIB)
    assert "actor LoRA adapters (weights, gradients, Adam)" in parts
    merged, _ = cpu_memory_estimate(cfg(*base, "actor_rollout_ref.model.lora.merge=true"), 2, params=500_000_000,
                                    shape=small_shape())
    assert merged - without == pytest.approx(16 * adapters / GIB)
    current = cfg("trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.use_kl_loss=true",
                  "actor_rollout_ref.model.lora.rank=8", "actor_rollout_ref.model.lora.target_modules=[q_proj,v_proj]")
    assert cpu_memory_estimate(current, 2, params=500_000_000, shape=small_shape())[0] - without == \
        pytest.approx((16 + 8) * 2 * (128 + 96) * 8 / GIB)


@pytest.mark.parametrize("rank_key", ["critic.model.lora_rank", "critic.model.lora.rank"])
def test_memory_floor_counts_the_critics_adapters_in_either_layout(rank_key):
    """A value model under LoRA (rank 8, all linear layers): its frozen base once (4 B a parameter) and its
    adapters 16 B each, in place of 16 B for every parameter."""
    from grpo_dist.config.memory import cpu_memory_estimate

    base = ("trainer.device=cpu", "trainer.n_gpus_per_node=2", "algorithm.adv_estimator=gae",
            "actor_rollout_ref.actor.use_kl_loss=false")
    full, parts = cpu_memory_estimate(cfg(*base), 2, params=500_000_000, critic_params=100_000_000)
    assert "critic 1.5" in parts
    got, parts = cpu_memory_estimate(cfg(*base, f"{rank_key}=8"), 2, params=500_000_000, critic_params=100_000_000,
                                     shape=small_shape())
    assert got - full == pytest.approx((-12 * 100_000_000 + 16 * 2 * 1024 * 8) / GIB)
    assert "critic (frozen base weights under LoRA)" in parts and "critic LoRA adapters" in parts


def test_the_run_check_reads_the_shape_from_the_models_config(tiny_model_dir, monkeypatch):
    """check_cpu_resources counts the adapters of the model it is given (its config.json), and leaves them
    out for a folder whose config cannot be read."""
    from grpo_dist.config import memory

    seen = []
    monkeypatch.setattr(memory, "check_cpu_memory", lambda *a: seen.append(a[-2]))
    monkeypatch.setattr(memory, "available_memory_gib", lambda: 64.0)
    c = cfg("trainer.device=cpu", "trainer.n_gpus_per_node=1", "actor_rollout_ref.model.lora_rank=8")
    memory.check_cpu_resources(c, str(tiny_model_dir))
    memory.check_cpu_resources(c, "/no/such/model")
    assert seen[0].hidden == 64 and seen[0].layers == 2 and seen[1] is None
