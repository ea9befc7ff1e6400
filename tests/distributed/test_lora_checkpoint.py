"""Checkpoints and exports of a LoRA policy (gloo, one and two ranks): a checkpoint holds the adapters and
their optimizer state, not the frozen base; resuming from it continues the run exactly; it refuses a
policy with other LoRA settings, or none; the export is a peft adapter folder that transformers + peft load
as the trained policy (and, on request, the merged model, equal to peft's merge_and_unload); an exported
adapter folder is a valid ``lora_adapter_path`` to start from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed._dist_helpers import make_batch, rows, run_ranks

T = 0.7
LR = 1e-2
STEPS, SAVE_AT = 3, 1  # a run of STEPS steps vs SAVE_AT steps + save + resume + the rest


def lora(**kw):
    from grpo_dist.training.settings import LoraSettings

    return LoraSettings(**{"rank": 4, "alpha": 8.0, **kw})


def actor_settings(**overrides):
    from grpo_dist.training.settings import ActorSettings

    # a warm-up schedule: a resume that lost the schedule's position would step at another rate
    base = dict(lr=LR, temperature=T, grad_clip=1.0, weight_decay=0.0, norm_constant=8.0, lora=lora(),
                ppo_micro_batch_size_per_gpu=2, lr_warmup_steps=2, total_training_steps=STEPS)
    base.update(overrides)
    return ActorSettings(**base)


def step_data(step: int, rank: int, world_size: int) -> dict[str, torch.Tensor]:
    from grpo_dist.training.micro_batches import rank_shard_indices

    data = make_batch(100 + step, rows=8)
    return rows(data, rank_shard_indices(8, num_mini_batches=1, rank=rank, world_size=world_size))


def trained_state(actor) -> dict:
    """The adapters and their Adam moments, whole (every rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model, optim = get_state_dict(actor.model, actor.optimizer,
                                  options=StateDictOptions(full_state_dict=True, ignore_frozen_params=True))
    return {"model": {k: v.clone() for k, v in model.items()},
            "optim": {f"{name}.{k}": v.clone() for name, s in optim["state"].items() for k, v in s.items()
                      if torch.is_tensor(v)}}


def resume_job(rank: int, world_size: int, model_dir: str, ckpt_dir: str) -> dict:
    """STEPS steps in one go, and SAVE_AT steps + save + a fresh actor (other adapters) + load + the rest."""
    from grpo_dist.training.actor import FSDPActor

    def make(seed: int):
        return FSDPActor(model_dir, actor_settings(lora=lora(seed=seed)), rank=rank, world_size=world_size,
                         device="cpu")

    out: dict = {"whole": [], "resumed": []}
    whole = make(0)
    for s in range(STEPS):
        out["whole"].append(whole.update_policy(step_data(s, rank, world_size)))
    out["whole_state"] = trained_state(whole)
    del whole
    first = make(0)
    for s in range(SAVE_AT):
        out["resumed"].append(first.update_policy(step_data(s, rank, world_size)))
    first.save_checkpoint(ckpt_dir)
    del first
    second = make(7)  # other initial adapters: only the load can make it continue the first run
    second.load_checkpoint(ckpt_dir)
    out["update_count_after_load"] = second.update_count
    for s in range(SAVE_AT, STEPS):
        out["resumed"].append(second.update_policy(step_data(s, rank, world_size)))
    out["resumed_state"] = trained_state(second)
    return out


def assert_resume_exact(out: dict) -> None:
    assert out["update_count_after_load"] == SAVE_AT
    assert len(out["whole"]) == len(out["resumed"]) == STEPS
    for a, b in zip(out["whole"], out["resumed"], strict=True):
        assert set(a) == set(b)
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key
    for part in ("model", "optim"):
        whole, resumed = out["whole_state"][part], out["resumed_state"][part]
        assert whole and set(whole) == set(resumed), part
        for name in whole:
            torch.testing.assert_close(resumed[name], whole[name], atol=1e-7, rtol=1e-6)


def one_rank_job(rank: int, world_size: int, model_dir: str, work: str) -> dict:
    from grpo_dist.training.actor import FSDPActor
    from grpo_dist.training.settings import LoraSettings

    work_dir = Path(work)
    out = resume_job(rank, world_size, model_dir, str(work_dir / "ckpt"))
    # --- the export of a trained policy ------------------------------------------------------------
    actor = FSDPActor(model_dir, actor_settings(), rank=rank, world_size=world_size, device="cpu")
    for s in range(2):  # the warm-up's first step has a rate of 0
        actor.update_policy(step_data(s, rank, world_size))
    data = make_batch(0, rows=8)
    out["policy_logp"], _ = actor.compute_log_prob(data, micro_batch_size=4)
    actor.export_hf(str(work_dir / "merged"), model_dir, merged=True)
    actor.export_hf(str(work_dir / "adapter_only"), model_dir, merged=False)
    # --- lora_adapter_path: an exported adapter as the start --------------------------------------
    started = FSDPActor(model_dir, actor_settings(lora=LoraSettings(rank=2, adapter_path=str(
        work_dir / "adapter_only" / "lora_adapter"))), rank=rank, world_size=world_size, device="cpu")
    out["started_logp"], _ = started.compute_log_prob(data, micro_batch_size=4)
    # --- refusals: other LoRA settings, no LoRA, a full fine-tuning checkpoint into a LoRA policy ---
    ckpt = str(work_dir / "ckpt")
    refusals = {}
    for name, settings in (("rank", actor_settings(lora=lora(rank=8))),
                           ("alpha", actor_settings(lora=lora(alpha=16.0))),
                           ("targets", actor_settings(lora=lora(target_modules=("q_proj", "v_proj")))),
                           ("full_policy", actor_settings(lora=LoraSettings()))):
        other = FSDPActor(model_dir, settings, rank=rank, world_size=world_size, device="cpu")
        try:
            other.load_checkpoint(ckpt)
            refusals[name] = None
        except ValueError as e:
            refusals[name] = str(e)
        if name == "full_policy":
            other.save_checkpoint(str(work_dir / "full_ckpt"))
    try:
        actor.load_checkpoint(str(work_dir / "full_ckpt"))
        refusals["full_checkpoint"] = None
    except ValueError as e:
        refusals["full_checkpoint"] = str(e)
    out["refusals"] = refusals
    return out


@pytest.fixture(scope="module")
def one_rank(fsdp_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("lora_ckpt")
    out = run_ranks(one_rank_job, 1, str(fsdp_model_dir), str(work))[0]
    return out | {"model_dir": str(fsdp_model_dir), "work": work}


def test_a_lora_checkpoint_holds_the_adapters_and_their_optimizer_state_not_the_base(one_rank):
    from grpo_dist.trainer.checkpoint import verify, write_manifest
    from grpo_dist.training.checkpoint_io import read_dcp_metadata

    ckpt = one_rank["work"] / "ckpt"
    keys = list(read_dcp_metadata(ckpt / "dcp" / ".metadata").state_dict_metadata)
    model_keys = [k for k in keys if k.startswith("model.")]
    optim_keys = [k for k in keys if k.startswith("optimizer.state.")]
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys)
    assert optim_keys and all(".lora_A." in k or ".lora_B." in k for k in optim_keys)
    assert not any("embed_tokens" in k or "base_layer" in k for k in keys)
    # the adapters' elements only (rank 4 on 64/128-wide layers: under a tenth of the model's), and a
    # checkpoint far smaller than a fully fine-tuned one of the same model
    from safetensors.torch import load_file

    meta = read_dcp_metadata(ckpt / "dcp" / ".metadata").state_dict_metadata
    saved = sum(meta[k].size.numel() for k in model_keys)
    base = sum(t.numel() for t in load_file(str(Path(one_rank["model_dir"]) / "model.safetensors")).values())
    assert saved < base / 10, (saved, base)

    def dcp_bytes(folder: Path) -> int:
        return sum(p.stat().st_size for p in (folder / "dcp").iterdir())

    assert dcp_bytes(ckpt) < dcp_bytes(one_rank["work"] / "full_ckpt") / 3
    layout = (ckpt / "lora.json").read_text()
    assert '"r": 4' in layout and "model.layers.0.self_attn.q_proj" in layout
    # the manifest covers every file, hashed as written; a changed byte is caught
    write_manifest(ckpt)
    assert verify(ckpt) is None
    with open(ckpt / "lora.json", "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(b"[" if first != b"[" else b"{")
    assert "lora.json" in verify(ckpt)


def test_resume_from_a_lora_checkpoint_is_exact_on_one_rank(one_rank):
    assert_resume_exact(one_rank)


def test_resume_from_a_lora_checkpoint_is_exact_on_two_ranks(fsdp_model_dir, tmp_path):
    outs = run_ranks(resume_job, 2, str(fsdp_model_dir), str(tmp_path / "ckpt"))
    for out in outs:
        assert_resume_exact(out)
    # both ranks wrote their shards of the adapters' state, no base weights
    assert {p.name for p in (tmp_path / "ckpt").glob("extra_rank*.pt")} == {"extra_rank0.pt", "extra_rank1.pt"}


def test_the_export_is_a_peft_adapter_folder_that_loads_as_the_trained_policy(one_rank):
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM

    from grpo_dist.training.policy import batched_logprobs

    folder = one_rank["work"] / "adapter_only" / "lora_adapter"
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert not (one_rank["work"] / "adapter_only" / "model.safetensors").exists()  # no merged model unless asked
    base_path = PeftConfig.from_pretrained(str(folder)).base_model_name_or_path
    assert Path(base_path) == Path(one_rank["model_dir"]).resolve()
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32),
                                      str(folder)).eval()
    data = make_batch(0, rows=8)
    mask = data["response_mask"].bool()
    logp, _ = batched_logprobs(model, data, device=torch.device("cpu"), micro_batch_size=None, max_token_len=None,
                               temperature=T, compute_entropy=False)
    torch.testing.assert_close(logp[mask], one_rank["policy_logp"][mask], atol=1e-5, rtol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    base_logp, _ = batched_logprobs(base.eval(), data, device=torch.device("cpu"), micro_batch_size=None,
                                    max_token_len=None, temperature=T, compute_entropy=False)
    assert (base_logp[mask] - logp[mask]).abs().max() > 1e-4  # the adapters were trained: not the base


def test_the_merged_export_equals_peft_merge_and_unload_of_the_exported_adapter(one_rank):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    root = one_rank["work"] / "merged"
    assert (root / "lora_adapter" / "adapter_model.safetensors").is_file()
    exported = load_file(str(root / "model.safetensors"))
    base = AutoModelForCausalLM.from_pretrained(one_rank["model_dir"], dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(root / "lora_adapter")).merge_and_unload().state_dict()
    assert set(exported) <= set(merged) and "model.layers.0.self_attn.q_proj.weight" in exported
    for name, t in exported.items():
        torch.testing.assert_close(t, merged[name], atol=1e-6, rtol=0)
    original = load_file(str(Path(one_rank["model_dir"]) / "model.safetensors"))
    assert (exported["model.layers.0.self_attn.q_proj.weight"] - original["model.layers.0.self_attn.q_proj.weight"]
            ).abs().max() > 0  # trained adapters, merged in
    # every exported file was hashed as written, for the checkpoint's manifest
    from grpo_dist.utils.file_digest import collect

    recorded = collect(root)
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert {"model.safetensors", "lora_adapter/adapter_model.safetensors", "lora_adapter/adapter_config.json"} <= on_disk
    assert set(recorded) == on_disk


def test_an_exported_adapter_is_a_valid_lora_adapter_path(one_rank):
    mask = make_batch(0, rows=8)["response_mask"].bool()
    torch.testing.assert_close(one_rank["started_logp"][mask], one_rank["policy_logp"][mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case, words", [
    ("rank", ["r 4 (checkpoint) vs 8"]),
    ("alpha", ["lora_alpha 8.0 (checkpoint) vs 16.0"]),
    ("targets", ["adapted modules differ", "mlp"]),
    ("full_policy", ["only LoRA adapters", "lora_rank=0"]),
    ("full_checkpoint", ["fully fine-tuned model", "LoRA adapters (rank 4)"]),
])
def test_a_checkpoint_refuses_a_policy_with_other_lora_settings(one_rank, case, words):
    message = one_rank["refusals"][case]
    assert message is not None, f"{case}: loaded without an error"
    assert message.startswith("cannot load the checkpoint ")
    for w in words:
        assert w in message, (w, message)
