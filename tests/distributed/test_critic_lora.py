"""LoRA on the FSDP2 critic (1 rank, gloo): the trainable set is the adapters and the value head, and the
optimizer holds exactly those; a value-loss update changes only them; at the start (B = 0) the LoRA
critic's values are the plain critic's, padded and packed; the sharded checkpoint holds the adapters and
the head (not the backbone) and resumes exactly; the Hugging Face export holds the merged weights, which a
plain critic loads with the same values.

One spawned job does the work and returns plain results; a module-scoped fixture runs it once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed._dist_helpers import make_batch, run_ranks
from tests.distributed.test_fsdp_critic import full_params, scored_batch, settings, with_gae

RANK, ALPHA = 4, 8.0
LORA_LR = 1e-3  # large enough that every trainable tensor visibly moves in two steps


def lora_settings(**overrides):
    from grpo_dist.training.settings import LoraSettings

    base = dict(rank=RANK, alpha=ALPHA, seed=3)
    base.update(overrides)
    return LoraSettings(**base)


def job_lora(rank: int, world_size: int, model_dir: str, ckpt_dir: str) -> dict:
    from grpo_dist.training.critic import FSDPCritic

    out: dict = {}
    make = lambda s, path=model_dir: FSDPCritic(path, s, rank=rank, world_size=world_size, device="cpu")  # noqa: E731
    lp = make_batch(7, rows=8, prompt_lengths=[6] * 4 + [2] * 4, response_lengths=[8] * 4 + [2] * 4)

    # B = 0 at the start: the LoRA critic computes the plain critic's values (the same head, drawn from
    # the same seed), padded and packed
    plain = make(settings(forward_micro_batch_size_per_gpu=3))
    out["plain_values"] = plain.compute_values(lp)
    out["plain_params"] = full_params(plain)
    del plain
    critic = make(settings(forward_micro_batch_size_per_gpu=3, lr=LORA_LR, lora=lora_settings()))
    out["lora_values"] = critic.compute_values(lp)
    packed = make(settings(use_dynamic_bsz=True, forward_max_token_len_per_gpu=16, use_remove_padding=True,
                           lora=lora_settings()))
    out["lora_packed_values"] = packed.compute_values(lp)
    del packed

    # the trainable set and the optimizer's parameters
    out["names"] = [n for n, _ in critic.model.named_parameters()]
    out["trainable"] = [n for n, p in critic.model.named_parameters() if p.requires_grad]
    params = {id(p): n for n, p in critic.model.named_parameters()}
    out["optimized"] = [params[id(p)] for g in critic.optimizer.param_groups for p in g["params"]]

    # two value-loss updates: what changed
    data = scored_batch(1)
    before = full_params(critic)
    first = critic.update_critic(with_gae(data, critic.compute_values(data)))
    after_one = full_params(critic)
    critic.save_checkpoint(ckpt_dir)
    second = critic.update_critic(with_gae(data, critic.compute_values(data)))
    out["update"] = {"before": before, "after_one": after_one, "after_two": full_params(critic),
                     "metrics": (first, second)}
    trained_values = critic.compute_values(lp)

    # resume: the checkpoint of step one, then the same second step
    resumed = make(settings(forward_micro_batch_size_per_gpu=3, lr=LORA_LR, lora=lora_settings(seed=11)))
    resumed.load_checkpoint(ckpt_dir)
    out["resumed_loaded"] = full_params(resumed)
    resumed.update_critic(with_gae(data, resumed.compute_values(data)))
    out["resumed_after_two"] = full_params(resumed)

    # the Hugging Face export: merged weights under the value model's names, loaded by a plain critic
    export = Path(ckpt_dir) / "export"
    critic.export_hf(export)
    from_export = make(settings(forward_micro_batch_size_per_gpu=3, seed=99), path=str(export))
    out["export"] = {"trained_values": trained_values, "loaded_values": from_export.compute_values(lp),
                     "names": sorted(full_params(from_export))}
    return out


@pytest.fixture(scope="module")
def lora_run(fsdp_model_dir, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("critic_lora") / "ckpt"
    return run_ranks(job_lora, 1, str(fsdp_model_dir), str(ckpt))[0] | {"ckpt": ckpt}


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def is_head(name: str) -> bool:
    return name.startswith("base_model.model.score.")


def test_the_trainable_set_is_the_adapters_and_the_value_head(lora_run):
    names, trainable = lora_run["names"], lora_run["trainable"]
    assert set(trainable) == {n for n in names if is_adapter(n) or is_head(n)}
    assert {n for n in trainable if is_head(n)} == {"base_model.model.score.weight", "base_model.model.score.bias"}
    assert not any(".score.lora_" in n for n in names), "the value head gets no adapter"
    # all-linear: every linear layer of the two blocks (7 each) has its two factors
    assert sum(is_adapter(n) for n in trainable) == 2 * 7 * 2
    assert sorted(lora_run["optimized"]) == sorted(trainable), "the optimizer holds the trainable parameters only"


def test_with_b_zero_the_lora_critic_computes_the_plain_critics_values(lora_run):
    plain = lora_run["plain_values"]
    assert plain.abs().max() > 1e-3
    torch.testing.assert_close(lora_run["lora_values"], plain, rtol=0, atol=1e-6)
    torch.testing.assert_close(lora_run["lora_packed_values"], plain, rtol=1e-5, atol=1e-5)


def test_a_value_loss_step_changes_only_the_adapters_and_the_head(lora_run):
    u = lora_run["update"]
    before, one, two = u["before"], u["after_one"], u["after_two"]
    trainable = set(lora_run["trainable"])
    for name in before:
        if name not in trainable:
            assert torch.equal(two[name], before[name]), f"frozen {name} changed"
    assert u["metrics"][0]["critic/grad_norm"] > 0
    for name in trainable:
        assert not torch.equal(two[name], before[name]), f"trainable {name} did not move"
    # the first step moves B away from zero (A's gradient is B^T ..., zero while B is)
    assert all(before[n].abs().max() == 0 and one[n].abs().max() > 0 for n in trainable if ".lora_B." in n)


def test_the_lora_critics_checkpoint_resumes_exactly(lora_run):
    """The checkpoint holds the adapters (another seed would draw another A), the head and their optimizer
    state, the backbone comes from the model folder: the resumed second step is the continuous one."""
    u = lora_run["update"]
    loaded = lora_run["resumed_loaded"]
    assert set(loaded) == set(u["after_one"])
    assert all(torch.equal(loaded[k], v) for k, v in u["after_one"].items())
    assert max((lora_run["resumed_after_two"][k] - v).abs().max().item() for k, v in u["after_two"].items()) < 1e-7


def test_the_lora_critics_checkpoint_holds_the_adapters_and_the_head_not_the_backbone(lora_run):
    from grpo_dist.training.checkpoint_io import read_dcp_metadata

    keys = list(read_dcp_metadata(lora_run["ckpt"] / "dcp" / ".metadata").state_dict_metadata)
    model_keys = {k.removeprefix("model.") for k in keys if k.startswith("model.")}
    assert model_keys == set(lora_run["trainable"])
    optim_keys = [k for k in keys if k.startswith("optimizer.state.")]
    assert optim_keys and all(is_adapter(k) or ".score." in k for k in optim_keys)
    assert not any("embed_tokens" in k or "base_layer" in k for k in keys)
    assert '"r": 4' in (lora_run["ckpt"] / "lora.json").read_text()


def test_the_export_holds_the_merged_value_model(lora_run):
    ex = lora_run["export"]
    assert ex["names"] == sorted(lora_run["plain_params"]), "the value model's own names, no peft names"
    assert (ex["trained_values"] - lora_run["plain_values"]).abs().max() > 1e-4, "training changed the values"
    torch.testing.assert_close(ex["loaded_values"], ex["trained_values"], rtol=1e-5, atol=1e-5)
