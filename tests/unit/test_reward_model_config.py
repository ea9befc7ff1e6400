"""The learned reward model's configuration: verl's two spellings (legacy ``reward_model.*``, current
``reward.reward_model.*``) and their conflicts, verl's defaults, every refusal, the grpo_dist keys
(combination, process reward model, iterative RL), the role rows, and verl's PPO-with-reward-model
scripts."""

from __future__ import annotations

import pytest

from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.schema import ConfigError
from grpo_dist.config.spec import resolve
from grpo_dist.config.reward_sources import model_sources, reward_model_spec
from grpo_dist.config.validate import validate_config
from tests.verl_ppo_scripts import RM_SCRIPTS, script_args
from tests.configs import cfg_of as load, refused

RM = ("reward_model.enable=true", "reward_model.model.path=/rm")
ITER = (*RM, "reward_model.iterative.enable=true")




# ------------------------------------------------------------------------------------------- spellings
def test_off_by_default_and_verls_defaults():
    cfg = load()
    spec = reward_model_spec(cfg)
    assert not spec.enable and spec.path == "~/models/FsfairX-LLaMA3-RM-v0.1"
    rm = cfg.reward_model
    assert rm.model.input_tokenizer == cfg.actor_rollout_ref.model.path  # verl: ${actor_rollout_ref.model.path}
    assert rm.micro_batch_size is None and rm.micro_batch_size_per_gpu is None and rm.max_length is None
    assert rm.use_dynamic_bsz == cfg.critic.use_dynamic_bsz
    assert rm.forward_max_token_len_per_gpu == cfg.critic.forward_max_token_len_per_gpu == 32768
    assert rm.model.trust_remote_code is False and rm.model.use_remove_padding is False
    assert rm.model.fsdp_config.param_offload is False and rm.model.fsdp_config.reshard_after_forward is True
    assert rm.model.fsdp_config.fsdp_size == -1 and rm.model.fsdp_config.wrap_policy.min_num_params == 0
    assert (spec.enable_resource_pool, spec.n_gpus_per_node, spec.nnodes) == (False, 8, 0)
    current = cfg.reward.reward_model
    assert current.enable is False and current.model_path is None and current.rollout == {}
    # the grpo_dist keys
    assert rm.combine == "verl" and rm.process.enable is False and rm.process.step_separator == "\n"
    it = rm.iterative
    assert it.enable is False and it.replay_fraction == 0.1 and it.reset_reference is True


@pytest.mark.parametrize("overrides", [
    ("reward_model.enable=true", "reward_model.model.path=/rm"),
    ("reward.reward_model.enable=true", "reward.reward_model.model_path=/rm"),
    ("reward_model.enable=true", "reward.reward_model.model_path=/rm"),
    ("reward.reward_model.enable=true", "reward_model.model.path=/rm"),
    ("reward_model.enable=true", "reward_model.model.path=/rm", "reward.reward_model.model_path=/rm"),
])
def test_either_spelling_turns_the_same_reward_model_on(overrides):
    spec = reward_model_spec(load(*overrides))
    assert spec.enable and spec.path == "/rm"


def test_the_two_spellings_may_not_contradict_each_other():
    msg = refused(*RM, "reward.reward_model.model_path=/other")
    assert "reward.reward_model.model_path" in msg and "reward_model.model.path" in msg and "set only one" in msg
    msg = refused(*RM, "reward_model.n_gpus_per_node=4", "reward.reward_model.n_gpus_per_node=2")
    assert "reward.reward_model.n_gpus_per_node" in msg and "reward_model.n_gpus_per_node" in msg


def test_verls_engine_settings_are_accepted_in_both_layouts():
    cfg = load(*RM, "reward_model.rollout.name=vllm", "reward_model.rollout.tensor_model_parallel_size=2",
               "reward.reward_model.rollout.gpu_memory_utilization=0.8", "reward_model.use_reward_loop=false")
    assert cfg.reward_model.rollout == {"name": "vllm", "tensor_model_parallel_size": 2}
    assert cfg.reward.reward_model.rollout == {"gpu_memory_utilization": 0.8}


def test_verls_deprecated_global_micro_batch_is_divided_over_the_ranks():
    assert model_sources(load(*RM))[0].micro_batch_size_per_gpu is None
    assert model_sources(load(*RM, "reward_model.micro_batch_size=8", "trainer.n_gpus_per_node=2"))[0].micro_batch_size_per_gpu == 4
    assert model_sources(load(*RM, "reward_model.micro_batch_size=8", "reward_model.micro_batch_size_per_gpu=3"))[0].micro_batch_size_per_gpu == 3


# ------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("overrides, key", [
    (("reward_model.enable_resource_pool=true",), "reward_model.enable_resource_pool"),
    (("reward.reward_model.enable_resource_pool=true",), "reward.reward_model.enable_resource_pool"),
    (("reward_model.model.fsdp_config.fsdp_size=2",), "reward_model.model.fsdp_config.fsdp_size"),
    (("reward_model.strategy=megatron",), "reward_model.strategy"),
    (("reward_model.combine=max",), "reward_model.combine"),
    (("reward_model.micro_batch_size_per_gpu=0",), "reward_model.micro_batch_size_per_gpu"),
    (("reward_model.model.fsdp_config.dtype=int8",), "reward_model.model.fsdp_config.dtype"),
    (("reward_model.process.enable=true",), "reward_model.process.enable"),  # grpo reads one score per response
    (("reward_model.process.enable=true", "algorithm.adv_estimator=grpo_process", "reward_model.process.step_separator=''"),
     "reward_model.process.step_separator"),
    (("reward_model.iterative.enable=true", "reward_model.iterative.replay_fraction=1.0"), "reward_model.iterative.replay_fraction"),
    (("reward_model.iterative.enable=true", "reward_model.iterative.heldout_fraction=-0.1"), "reward_model.iterative.heldout_fraction"),
    (("reward_model.iterative.enable=true", "reward_model.iterative.steps_per_iteration=0"), "reward_model.iterative.steps_per_iteration"),
    (("reward_model.iterative.enable=true", "reward_model.iterative.lr=0"), "reward_model.iterative.lr"),
    (("reward_model.iterative.enable=true", "reward_model.iterative.betas=[0.9,1.5]"), "reward_model.iterative.betas"),
    (("reward_model.iterative.enable=true", "reward_model.iterative.label_threshold=nan"), "reward_model.iterative.label_threshold"),
])
def test_refusals_name_the_key(overrides, key):
    msg = refused(*RM, *overrides)
    assert msg.startswith(key + " ="), msg


def test_an_outcome_reward_model_cannot_feed_process_supervision_alone():
    msg = refused(*RM, "algorithm.adv_estimator=grpo_process")
    assert "reward_model.process.enable=true" in msg and "step_rewards" in msg
    # with a custom function returning step rewards (verl mode: the function is the reward), or a
    # process reward model, it can
    load(*RM, "algorithm.adv_estimator=grpo_process", "custom_reward_function.path=/f.py")
    load(*RM, "algorithm.adv_estimator=grpo_process", "reward_model.process.enable=true")


@pytest.mark.parametrize("key", ["reward_model.iterative.enable", "reward_model.process.enable"])
def test_reward_model_features_need_a_reward_model(key):
    msg = refused(f"{key}=true")
    assert msg.startswith(key) and "reward_model.enable=true" in msg


def test_the_reward_model_folder_must_exist():
    cfg = to_typed(compose(list(RM)), list(RM))
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    assert "reward_model.model.path = '/rm'" in str(e.value)
    over = ["reward.reward_model.enable=true", "reward.reward_model.model_path=/nowhere"]
    with pytest.raises(ConfigError) as e:
        validate_config(to_typed(compose(over), over))
    assert "reward.reward_model.model_path = '/nowhere'" in str(e.value)


# ------------------------------------------------------------------------------------------- the roles
def test_role_rows_follow_the_configuration():
    from grpo_dist.trainer.roles import ROLES, active_roles

    def rows(cfg):
        return {r.name: r for r in active_roles(resolve(cfg))}

    plain = rows(load())
    assert "reward_model" not in plain
    cfg = load(*RM)
    r = rows(cfg)
    rm = r["reward_model"]
    assert rm.per_rank and rm.model is not None
    assert not rm.saves(resolve(cfg)) and not r["reference"].saves(resolve(cfg))  # a frozen reward model is its folder
    cfg = load(*ITER)
    r = rows(cfg)
    assert r["reward_model"].saves(resolve(cfg)) and r["reference"].saves(resolve(cfg))  # trained, and a reset reference
    cfg = load(*ITER, "reward_model.iterative.reset_reference=false")
    assert not rows(cfg)["reference"].saves(resolve(cfg))
    assert [r.name for r in ROLES].index("reward_model") < [r.name for r in ROLES].index("rollout")


# ------------------------------------------------------------------------------------------- verl's scripts
PATHS = dict(model="/m", rm="/rm", train="/d/train.parquet", train2="/d/math_train.parquet", test="/d/test.parquet",
             test2="/d/math_test.parquet")


@pytest.mark.parametrize("name", sorted(RM_SCRIPTS))
def test_verl_ppo_with_reward_model_script_validates(name):
    """The script as verl ships it (8 GPUs, its sizes), paths aside, composes and validates, and
    turns on the reward model it names."""
    cfg = load(*script_args(RM_SCRIPTS[name], cpu=False, **PATHS))
    spec = reward_model_spec(cfg)
    assert spec.enable and spec.path == "/rm" and cfg.algorithm.adv_estimator == "gae"
    assert cfg.reward_model.combine == "verl" and not cfg.custom_reward_function.path  # the reward model is the reward
    cpu = load(*script_args(RM_SCRIPTS[name], cpu=True, **PATHS))
    assert cpu.trainer.n_gpus_per_node == 2 and model_sources(cpu)[0].micro_batch_size_per_gpu == 2


def test_the_scripts_set_keys_of_the_reward_model():
    legacy = RM_SCRIPTS["rm_legacy"]["overrides"]
    assert "reward_model.model.fsdp_config.param_offload=True" in legacy and "reward_model.use_reward_loop=False" in legacy
    assert any(o.startswith("reward_model.rollout.") for o in RM_SCRIPTS["rm_reward_loop"]["overrides"])


# ------------------------------------------------------------------------------------------- start-up checks
def test_a_reward_model_folder_that_cannot_be_read_stops_at_start_up_naming_it(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from grpo_dist.config import preflight

    broken = tmp_path / "rm"
    broken.mkdir()
    (broken / "config.json").write_text("{ not json")
    cfg = load("reward_model.enable=true", f"reward_model.model.path={broken}")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError) as e:
        preflight.check_model_fits(cfg, str(tiny_model_dir), tok)
    msg = str(e.value)
    assert msg.startswith(f"the reward model {broken} (reward_model.model.path) cannot be loaded")


def with_reward_head(src, dst):
    """``src``'s backbone saved as a one-label token classifier (its head drawn here, saved), with its tokenizer."""
    import shutil

    from transformers import AutoModelForTokenClassification

    AutoModelForTokenClassification.from_pretrained(src, num_labels=1).save_pretrained(dst)
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja"):
            shutil.copy(f, dst / f.name)
    return dst


def rm_start_up(tiny_model_dir, rm_dir):
    """The start-up checks of a run scoring with the reward model in ``rm_dir`` (no worker starts)."""
    from transformers import AutoTokenizer

    from grpo_dist.config import preflight

    cfg = load("reward_model.enable=true", f"reward_model.model.path={rm_dir}")
    preflight.check_model_fits(cfg, str(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir))


def test_a_causal_lm_folder_is_refused_as_a_reward_model_before_the_workers_start(tmp_path, tiny_model_dir):
    """A causal LM has no scalar head: read as a reward model it would score with a random one (the
    only reward in the default combine mode). Start-up refuses it naming the folder and the weights."""
    import shutil

    causal = tmp_path / "causal"
    shutil.copytree(tiny_model_dir, causal)
    with pytest.raises(ValueError) as e:
        rm_start_up(tiny_model_dir, causal)
    msg = str(e.value)
    assert msg.startswith(f"the reward model {causal} (reward_model.model.path) holds no trained reward head"), msg
    assert "score.weight, score.bias are not in the folder (model.safetensors)" in msg
    assert "lm_head.weight (a causal LM's output layer" in msg and "\n" not in msg
    rm_start_up(tiny_model_dir, with_reward_head(tiny_model_dir, tmp_path / "rm"))  # the same backbone with a head loads


def test_a_classifier_whose_head_has_another_name_is_refused(tmp_path, tiny_model_dir):
    """Heads the token-classification class does not read: GPT-2's sequence classifier saves ``score``
    but GPT2ForTokenClassification reads ``classifier``; a Qwen2 value head saved as ``v_head.summary``
    (sharded, read from the index). Both would load with a random head; both are refused naming what
    the folder holds."""
    import json

    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, GPT2Config

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    gpt2 = tmp_path / "gpt2_sequence"
    config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=len(tok), n_positions=256, num_labels=1,
                        pad_token_id=0, bos_token_id=1, eos_token_id=1)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(gpt2)
    tok.save_pretrained(gpt2)
    with pytest.raises(ValueError) as e:
        rm_start_up(tiny_model_dir, gpt2)
    msg = str(e.value)
    assert msg.startswith(f"the reward model {gpt2} (reward_model.model.path) holds no trained reward head"), msg
    assert "GPT2ForTokenClassification" in msg and "classifier.weight, classifier.bias are not in the folder" in msg
    assert "outside the backbone the folder holds score.weight." in msg

    renamed = with_reward_head(tiny_model_dir, tmp_path / "v_head")
    weights = load_file(renamed / "model.safetensors")
    (renamed / "model.safetensors").unlink()
    head = {k.replace("score.", "v_head.summary."): v for k, v in weights.items() if k.startswith("score.")}
    body = {k: v for k, v in weights.items() if not k.startswith("score.")}
    save_file(body, renamed / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    save_file(head, renamed / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    index = {**{k: "model-00001-of-00002.safetensors" for k in body}, **{k: "model-00002-of-00002.safetensors" for k in head}}
    (renamed / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    with pytest.raises(ValueError) as e:
        rm_start_up(tiny_model_dir, renamed)
    msg = str(e.value)
    assert "score.weight, score.bias are not in the folder (model.safetensors.index.json)" in msg
    assert "outside the backbone the folder holds v_head.summary.bias, v_head.summary.weight." in msg


def test_the_reward_model_load_refuses_a_missing_head(tmp_path, tiny_model_dir):
    """The guard at load (in the reward-model worker, should a folder pass start-up): transformers'
    own report of a head weight it had to draw."""
    import torch
    from transformers import AutoModelForTokenClassification

    from grpo_dist.training.model_builder import load_hf_model

    def load_rm(path):
        return load_hf_model(path, dtype=torch.float32, attn_implementation="eager", require_head=True,
                             model_class=AutoModelForTokenClassification, config_overrides={"num_labels": 1})

    with pytest.raises(ValueError, match=r"holds no trained head for Qwen2ForTokenClassification: score.bias, "
                                         r"score.weight missing from its weights \(would be random\); the folder "
                                         r"holds lm_head.weight"):
        load_rm(tiny_model_dir)
    rm = with_reward_head(tiny_model_dir, tmp_path / "rm")
    saved = AutoModelForTokenClassification.from_pretrained(rm, num_labels=1).score.weight
    assert torch.equal(load_rm(rm).score.weight, saved)


def test_a_process_reward_model_must_read_the_policys_tokens(tmp_path, tiny_model_dir):
    """A reward model whose tokenizer differs from the policy's would be re-encoded; a process reward
    model (and iterative RL) read the policy's own step-end tokens, so that is refused at start-up."""
    import shutil

    from transformers import AutoTokenizer

    from grpo_dist.config import preflight, role_settings
    from grpo_dist.utils.tiny_model import build_tiny_model

    other = with_reward_head(build_tiny_model(tmp_path / "other_lm", vocab=list("0123456789abc"), max_position_embeddings=256),
                             tmp_path / "other")
    policy = tmp_path / "policy"
    shutil.copytree(tiny_model_dir, policy)
    tok = AutoTokenizer.from_pretrained(policy)
    common = ("reward_model.enable=true", f"reward_model.model.path={other}", f"actor_rollout_ref.model.path={policy}")
    cfg = load(*common)
    preflight.check_model_fits(cfg, str(policy), tok)  # an outcome reward model is re-encoded
    assert role_settings.reward_model_reencodes(cfg, str(other), str(policy)) == str(policy)
    cfg = load(*common, "reward_model.process.enable=true", "algorithm.adv_estimator=grpo_process")
    with pytest.raises(ValueError, match="a process reward model reads the policy's own tokens"):
        preflight.check_model_fits(cfg, str(policy), tok)
    cfg = load(*common, "reward_model.model.input_tokenizer=null")
    assert role_settings.reward_model_reencodes(cfg, str(other), str(policy)) is None


def test_the_iterative_label_threshold_reaches_the_plan():
    from grpo_dist.config.driver_plan import driver_plan

    assert driver_plan(resolve(load(*ITER)), "cpu", 4096).iterative.label_threshold == 0.5
    assert driver_plan(resolve(load(*ITER, "reward_model.iterative.label_threshold=1.0")), "cpu", 4096).iterative.label_threshold == 1.0
    assert driver_plan(resolve(load(*ITER, "reward_model.iterative.label_threshold=null")), "cpu", 4096).iterative.label_threshold is None


def test_the_head_check_reads_pytorch_files_and_leaves_unreadable_ones_to_the_load(tmp_path, tiny_model_dir):
    import shutil

    import torch
    from safetensors.torch import load_file

    from grpo_dist.training.reward_model import check_reward_head

    pt = tmp_path / "pt"
    shutil.copytree(tiny_model_dir, pt)
    torch.save(load_file(pt / "model.safetensors"), pt / "pytorch_model.bin")
    (pt / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"score.weight, score.bias are not in the folder \(pytorch_model.bin\)"):
        check_reward_head(pt)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    check_reward_head(broken)  # no verdict from names it cannot read: the load reports the file
