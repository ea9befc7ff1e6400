"""The FSDP2 actor with peft LoRA adapters (gloo, one rank): only the adapters of the target modules are
trained; the reference is the base model with the adapters off (equal to a plain forward of the model
folder); the weights sent to the rollout engine are the adapter factors alone (``lora.merge=false``, a peft
adapter folder's tensors and config) or peft's merge_and_unload under the base model's names
(``merge=true``); one optimizer step does not depend on the micro-batch size."""

from __future__ import annotations

import pytest
import torch

from tests.distributed._dist_helpers import build_tiny_model, make_batch, run_ranks

T = 0.7
LR = 1e-2  # large, so one step moves the adapters visibly


def lora(**kw):
    from grpo_dist.training.settings import LoraSettings

    return LoraSettings(**{"rank": 4, "alpha": 8.0, **kw})


def actor_settings(**overrides):
    from grpo_dist.training.settings import ActorSettings

    base = dict(lr=LR, temperature=T, grad_clip=1.0, weight_decay=0.0, norm_constant=8.0, lora=lora())
    base.update(overrides)
    return ActorSettings(**base)


def plain_logprobs(model_dir: str, data: dict, **kw) -> torch.Tensor:
    """Log-probs of the folder's model, loaded by transformers without peft or FSDP."""
    from transformers import AutoModelForCausalLM

    from grpo_dist.training.policy import batched_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    logp, _ = batched_logprobs(model, data, device=torch.device("cpu"), micro_batch_size=None, max_token_len=None,
                               temperature=T, compute_entropy=False, **kw)
    return logp


def job(rank: int, world_size: int, model_dir: str, tied_dir: str, export_dir: str) -> dict:
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from grpo_dist.training.actor import FSDPActor
    from grpo_dist.training.reference import AdapterOffReference
    from grpo_dist.training.settings import ReferenceSettings

    out: dict = {}
    data = make_batch(0, rows=8)
    # --- what is trained ------------------------------------------------------------------------
    actor = FSDPActor(model_dir, actor_settings(ppo_micro_batch_size_per_gpu=2), rank=rank, world_size=world_size,
                      device="cpu")
    out["trainable"] = sorted(n for n, p in actor.model.named_parameters() if p.requires_grad)
    out["frozen"] = sorted(n for n, p in actor.model.named_parameters() if not p.requires_grad)
    out["optimized"] = sum(len(g["params"]) for g in actor.optimizer.param_groups)
    before = {k: v.clone() for k, v in actor.state_dict_for_sync().items()}
    metrics = actor.update_policy(data)
    out["grad_norm"] = metrics["actor/grad_norm"]
    out["merged_before"] = before
    # --- the reference: the base model with the adapters off -------------------------------------
    for packed in (False, True):
        ref = AdapterOffReference(actor, ReferenceSettings(use_remove_padding=packed))
        out[f"ref_logp_{packed}"] = ref.compute_ref_log_prob(data, micro_batch_size=3, temperature=T)
    out["policy_logp"], _ = actor.compute_log_prob(data, micro_batch_size=3)
    from grpo_dist.training.policy import batched_logprobs

    for fused in (False, True):  # packed rows (one row of real tokens, per-sequence attention) through the adapters
        out[f"policy_logp_packed_{fused}"], _ = batched_logprobs(
            actor.model, data, device=actor.device, micro_batch_size=3, max_token_len=None, temperature=T,
            compute_entropy=False, remove_padding=True, fused=fused)
    # --- the merged weights, against peft's merge_and_unload of the same adapters ----------------
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(actor.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    reference = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                               LoraConfig(r=4, lora_alpha=8.0, target_modules="all-linear", task_type="CAUSAL_LM"))
    missing, unexpected = reference.load_state_dict(full, strict=False)
    assert not unexpected and not [k for k in missing if "lora_" in k], (missing, unexpected)
    out["peft_adapter"] = {k: v.clone() for k, v in get_peft_model_state_dict(reference).items()}
    out["peft_merged"] = reference.merge_and_unload().state_dict()
    out["synced"] = actor.state_dict_for_sync()
    out["bucketed"] = bucketed(actor)  # merge=false: the adapters alone
    out["adapter_config"] = actor.adapter_config()
    actor.export_hf(export_dir)
    # --- micro-batch invariance: one optimizer step, micro-batch 1 vs 2 ---------------------------
    for micro in (1, 2):
        a = FSDPActor(model_dir, actor_settings(ppo_micro_batch_size_per_gpu=micro), rank=rank, world_size=world_size,
                      device="cpu")
        out[f"micro{micro}_metrics"] = a.update_policy(data)
        out[f"micro{micro}"] = get_model_state_dict(a.model, options=StateDictOptions(full_state_dict=True))
    # --- tied embeddings: the output layer is not adapted, the reference is still the base ---------
    tied = FSDPActor(tied_dir, actor_settings(lora=lora(merge=True)), rank=rank, world_size=world_size, device="cpu")
    tied.update_policy(data)
    out["tied_ref_logp"] = AdapterOffReference(tied, ReferenceSettings()).compute_ref_log_prob(data, temperature=T)
    out["tied_synced"] = tied.state_dict_for_sync()
    out["tied_bucketed"] = bucketed(tied)  # merge=true: the merged weights
    out["tied_adapter_config"] = tied.adapter_config()
    return out


def bucketed(actor) -> dict:
    """What the weight sync sends the engine: every bucket gathered and unpacked (small buckets: several)."""
    from grpo_dist.rollout.weight_sync import unpack

    sent = {}
    for b in actor.weight_buckets(None, bucket_bytes=20_000):
        sent.update({k: v.clone() for k, v in unpack(b, actor.pack_weight_bucket(b))})
    return sent


@pytest.fixture(scope="module")
def result(fsdp_model_dir, tmp_path_factory):
    tied = build_tiny_model(tmp_path_factory.mktemp("tied"), tie_word_embeddings=True)
    export = tmp_path_factory.mktemp("lora_export") / "hf"
    out = run_ranks(job, 1, str(fsdp_model_dir), str(tied), str(export))[0]
    return out | {"model_dir": str(fsdp_model_dir), "tied_dir": str(tied), "export": str(export)}


def test_adapters_wrap_every_linear_layer_but_the_output_and_only_they_are_trained(result):
    trainable = result["trainable"]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    adapted = {n.split(".lora_")[0].removeprefix("base_model.model.") for n in trainable}
    expected = {f"model.layers.{i}.{m}" for i in range(2) for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert adapted == expected
    assert result["optimized"] == len(trainable)  # the optimizer holds the adapters only
    assert any(n.endswith("embed_tokens.weight") for n in result["frozen"])
    assert result["grad_norm"] > 0


def test_the_reference_is_the_base_model_with_the_adapters_off(result):
    data = make_batch(0, rows=8)
    mask = data["response_mask"].bool()
    for packed in (False, True):
        plain = plain_logprobs(result["model_dir"], data, remove_padding=packed)
        torch.testing.assert_close(result[f"ref_logp_{packed}"][mask], plain[mask], atol=1e-5, rtol=1e-5)
    # the trained adapters do change the policy: the reference is not just the policy
    assert (result["policy_logp"][mask] - result["ref_logp_False"][mask]).abs().max() > 1e-4
    tied_plain = plain_logprobs(result["tied_dir"], data)
    torch.testing.assert_close(result["tied_ref_logp"][mask], tied_plain[mask], atol=1e-5, rtol=1e-5)


def test_the_synced_weights_are_peft_merge_and_unload_under_the_base_names(result):
    from safetensors.torch import load_file

    base = load_file(f"{result['model_dir']}/model.safetensors")
    synced, merged = result["synced"], result["peft_merged"]
    assert set(synced) == set(merged) and set(base) <= set(synced)
    for name, t in synced.items():
        torch.testing.assert_close(t, merged[name], atol=0, rtol=0)
    # B starts at zero: before any update the merged weights are the base model's
    for name, t in result["merged_before"].items():
        torch.testing.assert_close(t, base[name], atol=0, rtol=0) if name in base else None
    assert any((synced[n] - base[n]).abs().max() > 0 for n in base if n.endswith("q_proj.weight"))
    tied = result["tied_synced"]
    assert not any("lora_" in n or "base_layer" in n for n in tied)
    # merge=true: the sync sends these merged weights, bucket by bucket
    assert set(result["tied_bucketed"]) == set(tied) and result["tied_adapter_config"] is None
    for name, t in tied.items():
        torch.testing.assert_close(result["tied_bucketed"][name], t, atol=0, rtol=0)


def test_the_adapter_only_sync_sends_a_peft_adapter_that_loads_as_the_policy(result, tmp_path):
    """merge=false: the buckets hold exactly the adapter's factors under peft's saved names, equal to what
    peft saves for the same model; written with the configuration the actor reports, they load back in
    peft on the base folder as the trained policy (what the engines serve)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from grpo_dist.rollout.adapters import write_adapter

    sent, saved = result["bucketed"], result["peft_adapter"]
    assert set(sent) == set(saved) and all(".lora_A." in n or ".lora_B." in n for n in sent)
    for name, t in sent.items():
        torch.testing.assert_close(t, saved[name], atol=0, rtol=0)
    config = result["adapter_config"]
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
    folder = write_adapter(tmp_path / "adapter", sent.items(), config)
    base = AutoModelForCausalLM.from_pretrained(result["model_dir"], dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(folder)).eval()
    data = make_batch(0, rows=8)
    mask = data["response_mask"].bool()
    from grpo_dist.training.policy import batched_logprobs

    logp, _ = batched_logprobs(model, data, device=torch.device("cpu"), micro_batch_size=None, max_token_len=None,
                               temperature=T, compute_entropy=False)
    torch.testing.assert_close(logp[mask], result["policy_logp"][mask], atol=1e-5, rtol=1e-5)


def test_packed_and_fused_forwards_run_through_the_adapted_layers(result):
    mask = make_batch(0, rows=8)["response_mask"].bool()
    for fused in (False, True):
        torch.testing.assert_close(result[f"policy_logp_packed_{fused}"][mask], result["policy_logp"][mask],
                                   atol=1e-5, rtol=1e-5)


def test_the_export_is_the_merged_model_that_transformers_loads(result):
    from transformers import AutoModelForCausalLM

    data = make_batch(0, rows=8)
    mask = data["response_mask"].bool()
    exported = plain_logprobs(result["export"], data)
    torch.testing.assert_close(exported[mask], result["policy_logp"][mask], atol=1e-5, rtol=1e-5)
    AutoModelForCausalLM.from_pretrained(result["export"])  # a plain model folder


def test_one_lora_step_does_not_depend_on_the_micro_batch_size(result):
    ma, mb = result["micro1_metrics"], result["micro2_metrics"]
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/entropy"):
        assert ma[key] == pytest.approx(mb[key], rel=1e-5, abs=1e-7), key
    a, b = result["micro1"], result["micro2"]
    assert set(a) == set(b)
    moved = 0.0
    for name in a:
        # Adam divides by the gradient's size: an element whose gradient is near zero moves by up to LR on
        # a float-rounding difference; the actor's own invariance test allows 10% of its LR, this 0.5%
        torch.testing.assert_close(a[name], b[name], atol=5e-3 * LR, rtol=0)
        if "lora_B" in name:
            moved = max(moved, float(a[name].abs().max()))
    assert moved > 0  # the step did move the adapters


def two_rank_step(rank: int, world_size: int, model_dir: str) -> dict:
    """The micro-batch test's step (8 rows, one mini-batch, micro-batches of 2) with each rank holding its half."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from grpo_dist.training.actor import FSDPActor
    from grpo_dist.training.micro_batches import rank_shard_indices
    from tests.distributed._dist_helpers import rows

    data = make_batch(0, rows=8)
    mine = rows(data, rank_shard_indices(8, num_mini_batches=1, rank=rank, world_size=world_size))
    actor = FSDPActor(model_dir, actor_settings(ppo_micro_batch_size_per_gpu=2), rank=rank, world_size=world_size,
                      device="cpu")
    metrics = actor.update_policy(mine)
    return {"metrics": metrics, "state": get_model_state_dict(actor.model, options=StateDictOptions(full_state_dict=True))}


def test_one_lora_step_on_two_ranks_equals_one_rank(result):
    two = run_ranks(two_rank_step, 2, result["model_dir"])
    one_metrics, one_state = result["micro2_metrics"], result["micro2"]
    for out in two:  # both ranks hold the same whole adapters after the step
        for key in ("actor/grad_norm", "actor/pg_loss"):
            assert out["metrics"][key] == pytest.approx(one_metrics[key], rel=1e-5, abs=1e-7), key
        assert set(out["state"]) == set(one_state)
        for name, value in out["state"].items():
            torch.testing.assert_close(value, one_state[name], atol=5e-3 * LR, rtol=0)
