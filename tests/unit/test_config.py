"""Configuration: composition, overrides, generated files in step, and every validation failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grpo_dist.config import docgen
from grpo_dist.config.loader import all_keys, compose, to_typed
from grpo_dist.config.schema import ConfigError
from grpo_dist.config.validate import validate_config
from grpo_dist.main import main

ROOT = Path(__file__).resolve().parents[2]


def load(*overrides: str, check_paths: bool = True):
    cfg = to_typed(compose(list(overrides)), list(overrides))
    validate_config(cfg, check_paths=check_paths)
    return cfg


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


@pytest.fixture
def data_file(tmp_path):
    f = tmp_path / "train.parquet"
    f.write_bytes(b"PAR1")
    return f


def test_defaults_compose_and_validate():
    cfg = load()
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor_rollout_ref.actor.use_kl_loss is True
    # interpolations resolve to the data keys, as in verl
    assert cfg.actor_rollout_ref.rollout.response_length == cfg.data.max_response_length
    assert cfg.trainer.default_local_dir == "checkpoints/grpo_dist/reverse_tiny"


def test_overrides_reach_typed_config():
    cfg = load(
        "actor_rollout_ref.rollout.n=4",
        "data.max_response_length=17",
        "actor_rollout_ref.actor.optim.betas=[0.8,0.9]",
        "trainer.logger=[console]",
    )
    assert cfg.actor_rollout_ref.rollout.n == 4
    assert cfg.actor_rollout_ref.rollout.response_length == 17
    assert list(cfg.actor_rollout_ref.actor.optim.betas) == [0.8, 0.9]
    assert list(cfg.trainer.logger) == ["console"]


def test_each_compose_gets_a_config_of_its_own():
    """The schema and the YAML file are kept parsed between composes (config/loader.py): what one compose's
    caller changes in its config reaches neither the next compose nor a config composed before it."""
    from omegaconf import OmegaConf

    first = compose(["data.train_batch_size=8"])
    second = compose(["data.train_batch_size=8"])
    assert OmegaConf.to_yaml(first) == OmegaConf.to_yaml(second)
    assert OmegaConf.is_struct(second)  # the schema's closed key set holds in every copy
    with pytest.raises(Exception, match="no_such_key"):
        second.data.no_such_key = 1
    second.data.train_batch_size = 999
    second.actor_rollout_ref.actor.optim.betas.append(0.5)
    third = compose(["data.train_batch_size=8"])
    assert first.data.train_batch_size == third.data.train_batch_size == 8
    assert list(first.actor_rollout_ref.actor.optim.betas) == list(third.actor_rollout_ref.actor.optim.betas)
    assert len(third.actor_rollout_ref.actor.optim.betas) == 2


def test_kl_loss_agg_mode_reaches_the_actor_objective():
    from grpo_dist.config.role_settings import actor_settings
    from grpo_dist.training.objective import PolicyObjective

    default = actor_settings(load(), "cpu", total_training_steps=10)
    assert default.kl_loss_agg_mode is None  # verl: the KL term is aggregated like the policy term
    assert PolicyObjective.from_settings(default).kl_loss_agg_mode is None
    cfg = load("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum", "actor_rollout_ref.actor.kl_loss_agg_mode=token-mean")
    objective = PolicyObjective.from_settings(actor_settings(cfg, "cpu", total_training_steps=10))
    assert (objective.loss_agg_mode, objective.kl_loss_agg_mode) == ("seq-mean-token-sum", "token-mean")


def test_generated_yaml_and_docs_are_in_step():
    assert docgen.main(["--check"]) == 0, "run `python -m grpo_dist.config.docgen`"


def _readme_refused_block() -> str:
    text = (ROOT / "README.md").read_text()
    assert docgen.README_BEGIN in text and docgen.README_END in text, "the README's refused list is not the generated one"
    return text[text.index(docgen.README_BEGIN):text.index(docgen.README_END)]


def test_the_readmes_refused_list_and_the_reference_come_from_the_key_states():
    """The README names only features refused by their keys' states, with what to use instead, and the
    reference's table of refused features holds the same keys."""
    import re

    from grpo_dist.config.states import state_of

    block = _readme_refused_block()
    assert block + docgen.README_END == docgen.render_readme_block(), "run `python -m grpo_dist.config.docgen`"
    doc = (ROOT / "docs" / "configuration.md").read_text()
    table = doc[doc.index("## Features refused here"):doc.index("## Defaults that differ from verl's")]
    doc_keys = set(re.findall(r"^\| `([^`]+)` \|", table, re.M))
    named = re.findall(r"\(`([^`]+)`(?: and \d+ more)?\): \S", block)
    assert len(named) == sum(len(items) for _g, items in docgen.refused_features()) > 40
    for key in named:
        assert key in doc_keys, key
        state = state_of(key.split("=")[0])
        assert state.kind == "refused" or getattr(state, "refuse", ()) or getattr(state, "otherwise", ""), key
    # implemented features the README once listed as refused
    implemented = {"actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.rollout.mode",
                   "actor_rollout_ref.rollout.enable_chunked_prefill", "actor_rollout_ref.rollout.engine_kwargs.vllm",
                   "trainer.log_val_generations", "trainer.val_only", "reward_model.enable", "reward.reward_model.enable",
                   "reward_model.model.path"}
    assert not implemented & {key.split("=")[0] for key in named}
    # the README's opening sentence names features from the list
    intro = (ROOT / "README.md").read_text().split("## ", 1)[0]
    for feature in ("LoRA", "Megatron", "SGLang", "multi-turn", "profil"):
        assert feature in intro and feature.lower() in block.lower(), feature


def test_the_references_header_does_not_call_learned_reward_models_unknown_keys():
    head = (ROOT / "docs" / "configuration.md").read_text().split("\n## ", 1)[0]
    assert "unknown key" in head and "learned reward model" not in head and "Megatron-only keys) are refused" not in head


def test_every_key_is_documented_in_yaml_with_a_comment():
    text = (ROOT / "conf" / "grpo_trainer.yaml").read_text()
    for key in all_keys():
        leaf = key.rsplit(".", 1)[-1]
        lines = [ln for ln in text.splitlines() if ln.strip().startswith(leaf + ":")]
        assert lines and all("# " in ln and ln.split("# ", 1)[1].strip() for ln in lines), key


def test_required_verl_keys_exist():
    keys = set(all_keys())
    for k in [
        "data.train_files", "data.val_files", "data.prompt_key", "data.max_prompt_length", "data.max_response_length",
        "data.train_batch_size", "data.val_batch_size", "data.shuffle", "data.seed", "data.filter_overlong_prompts",
        "data.truncation", "actor_rollout_ref.model.path", "actor_rollout_ref.model.enable_gradient_checkpointing",
        "actor_rollout_ref.model.use_remove_padding", "actor_rollout_ref.model.trust_remote_code",
        "actor_rollout_ref.actor.strategy", "actor_rollout_ref.actor.ppo_mini_batch_size",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor.use_dynamic_bsz",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor_rollout_ref.actor.ppo_epochs",
        "actor_rollout_ref.actor.shuffle", "actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.clip_ratio_low",
        "actor_rollout_ref.actor.clip_ratio_high", "actor_rollout_ref.actor.clip_ratio_c", "actor_rollout_ref.actor.loss_agg_mode",
        "actor_rollout_ref.actor.entropy_coeff", "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_coef",
        "actor_rollout_ref.actor.kl_loss_type", "actor_rollout_ref.actor.grad_clip", "actor_rollout_ref.actor.optim.lr",
        "actor_rollout_ref.actor.optim.weight_decay", "actor_rollout_ref.actor.optim.betas",
        "actor_rollout_ref.actor.optim.lr_warmup_steps", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
        "actor_rollout_ref.actor.optim.lr_scheduler_type", "actor_rollout_ref.actor.optim.min_lr_ratio",
        "actor_rollout_ref.actor.fsdp_config.param_offload", "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
        "actor_rollout_ref.actor.fsdp_config.reshard_after_forward", "actor_rollout_ref.actor.fsdp_config.model_dtype",
        "actor_rollout_ref.actor.fsdp_config.dtype", "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.n",
        "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.top_p", "actor_rollout_ref.rollout.top_k",
        "actor_rollout_ref.rollout.response_length", "actor_rollout_ref.rollout.gpu_memory_utilization",
        "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.rollout.max_num_seqs",
        "actor_rollout_ref.rollout.enforce_eager", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.val_kwargs.n", "actor_rollout_ref.rollout.val_kwargs.temperature",
        "actor_rollout_ref.rollout.val_kwargs.top_p", "actor_rollout_ref.rollout.val_kwargs.do_sample",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.ref.fsdp_config.param_offload",
        "algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo", "algorithm.gamma", "algorithm.lam",
        "algorithm.use_kl_in_reward", "algorithm.kl_penalty", "algorithm.kl_ctrl.type", "algorithm.kl_ctrl.kl_coef",
        "algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.target_kl", "reward_model.enable", "reward_model.reward_manager",
        "custom_reward_function.path", "custom_reward_function.name", "trainer.total_epochs", "trainer.total_training_steps",
        "trainer.project_name", "trainer.experiment_name", "trainer.logger", "trainer.nnodes", "trainer.n_gpus_per_node",
        "trainer.device", "trainer.save_freq", "trainer.test_freq", "trainer.val_before_train", "trainer.resume_mode",
        "trainer.resume_from_path", "trainer.default_local_dir", "trainer.max_actor_ckpt_to_keep", "trainer.seed",
        "ray_kwargs.ray_init.address", "ray_kwargs.ray_init.num_cpus",
    ]:
        assert k in keys, k


# --- every validation failure: (overrides, text that must appear in the one message) ---------------
FAILURES = [
    (["actor_rollout_ref.actor.ppo_epoch=2"], ["unknown config key", "actor_rollout_ref.actor.ppo_epochs"]),
    (["trainer.nodes=2"], ["unknown config key", "trainer.nnodes"]),
    (["algorithm.adv_estimator=ppo"], ["algorithm.adv_estimator", "'ppo'", "grpo", "rloo"]),
    (["actor_rollout_ref.actor.loss_agg_mode=mean"], ["loss_agg_mode", "'mean'", "token-mean", "seq-mean-token-sum-norm"]),
    (["actor_rollout_ref.actor.kl_loss_type=k9"], ["kl_loss_type", "'k9'", "low_var_kl"]),
    (["actor_rollout_ref.actor.kl_loss_agg_mode=mean"], ["kl_loss_agg_mode", "'mean'", "token-mean", "seq-mean-token-sum"]),
    (["algorithm.adv_estimator=grpo_process", "algorithm.use_kl_in_reward=true"], ["use_kl_in_reward", "step ends"]),
    (["actor_rollout_ref.actor.kl_loss_type=full"], ["kl_loss_type", "'full'", "low_var_kl"]),
    (["actor_rollout_ref.rollout.name=sglang"], ["rollout.name", "'sglang'", "vllm", "hf"]),
    (["algorithm.adv_estimator=grpo_passk", "actor_rollout_ref.rollout.n=1"], ["rollout.n", "1", ">= 2", "grpo_passk"]),
    (["algorithm.adv_estimator=rloo", "actor_rollout_ref.rollout.n=1"], ["rollout.n", ">= 2", "rloo"]),
    (["data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=12"], ["ppo_mini_batch_size", "12", "divisible", "32"]),
    (
        ["actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=3", "trainer.n_gpus_per_node=4"],
        ["ppo_mini_batch_size", "6 responses", "4 data-parallel ranks"],
    ),
    (
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5", "trainer.n_gpus_per_node=2"],
        ["ppo_micro_batch_size_per_gpu", "5", "128 responses", "2 data-parallel ranks"],
    ),
    (["actor_rollout_ref.actor.clip_ratio=0"], ["clip_ratio", "0", "> 0"]),
    (["actor_rollout_ref.actor.clip_ratio_high=-0.1"], ["clip_ratio_high", "-0.1", "> 0"]),
    (["actor_rollout_ref.actor.clip_ratio_c=1.0"], ["clip_ratio_c", "1.0", "> 1"]),
    (["actor_rollout_ref.actor.kl_loss_coef=-0.01"], ["kl_loss_coef", "-0.01", ">= 0"]),
    (["actor_rollout_ref.actor.entropy_coeff=-1"], ["entropy_coeff", ">= 0"]),
    (["actor_rollout_ref.actor.optim.lr=-1e-5"], ["optim.lr", "-1e-05", "> 0"]),
    (["algorithm.kl_ctrl.kl_coef=-0.5"], ["kl_ctrl.kl_coef", ">= 0"]),
    (["data.max_response_length=0"], ["response_length", "0", "> 0"]),
    (["actor_rollout_ref.rollout.update_weights_bucket_megabytes=0"], ["update_weights_bucket_megabytes", "> 0"]),
    (["actor_rollout_ref.model.path=/nonexistent/model"], ["actor_rollout_ref.model.path", "/nonexistent/model", "no such directory"]),
    (["data.train_files=/nonexistent/train.parquet"], ["data.train_files", "/nonexistent/train.parquet", "no such file"]),
    (["data.val_files=[/nonexistent/a.jsonl]"], ["data.val_files", "/nonexistent/a.jsonl"]),
    (["custom_reward_function.path=/nonexistent/r.py"], ["custom_reward_function.path", "no such"]),
    (["actor_rollout_ref.rollout.val_kwargs.n=4"], ["val_kwargs.n", "greedy"]),
    (["actor_rollout_ref.rollout.temperature=0"], ["rollout.do_sample", "identical responses"]),
    (["actor_rollout_ref.rollout.temperature=0"], ["actor_rollout_ref.rollout.temperature = 0", "positive temperature",
                                                    "do_sample=false"]),
    (["actor_rollout_ref.rollout.do_sample=false"], ["actor_rollout_ref.rollout.do_sample = False", "rollout.n=1"]),
    (["actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.n=4"],
     ["val_kwargs.temperature = 0", "positive"]),
    (["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=3", "data.train_batch_size=48",
      "actor_rollout_ref.actor.ppo_mini_batch_size=12"],
     ["tensor_model_parallel_size", "consecutive ranks of one node", "valid: 1, 3"]),
    (["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.name=hf"],
     ["tensor_model_parallel_size", "rollout.name=vllm"]),
    (["trainer.worker_call_timeout_min_s=0"], ["trainer.worker_call_timeout_min_s", "0", "> 0"]),
    (["trainer.nnodes=abc"], ["trainer.nnodes", "'abc'", "Integer"]),
    (["trainer.device=tpu"], ["trainer.device", "cpu", "cuda"]),
    (["trainer.resume_mode=resume_path"], ["resume_from_path", "resume_path"]),
    (["trainer.logger=[console,neptune]"], ["trainer.logger", "'neptune'", "tensorboard"]),
]


@pytest.mark.parametrize("overrides,needles", FAILURES, ids=[" ".join(o) for o, _ in FAILURES])
def test_validation_failure_message(overrides, needles):
    with pytest.raises(ConfigError) as ei:
        load(*overrides)
    msg = str(ei.value)
    for n in needles:
        assert n in msg, f"{n!r} not in message: {msg}"
    assert "Traceback" not in msg


def test_hub_model_name_passes_validation_but_must_resolve_at_start(monkeypatch, tmp_path):
    cfg = load("actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct")
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    from grpo_dist import tasks

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf_home"))
    with pytest.raises(ValueError) as ei:
        tasks.resolve("Qwen/Qwen2.5-0.5B-Instruct")
    assert "huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct" in str(ei.value)


def test_valid_paths_pass(model_dir, data_file):
    cfg = load(f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={data_file}", "data.val_files=null")
    assert cfg.data.val_files is None


def test_cli_prints_composed_config(capsys):
    assert main(["--cfg", "job", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=8"]) == 0
    out = capsys.readouterr().out
    assert "adv_estimator: grpo" in out and "'n': 8" in out and "train_batch_size:" in out


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["algorithm.adv_estimator=nope"], "algorithm.adv_estimator"),
        (["bogus"], "not an override"),
        (["--frobnicate"], "unknown flag"),
        (["--cfg", "everything"], "--cfg"),
    ],
)
def test_cli_errors_are_one_message(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert err.startswith("grpo_dist: configuration error:")


def test_cli_subprocess_fails_fast_without_traceback():
    """The real entry point: non-zero exit, one message, within seconds, nothing started."""
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_dist.main", "actor_rollout_ref.actor.loss_agg_mode=bogus"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "loss_agg_mode" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("given", [["4", "abc"], ["abc", "4"]])
def test_a_key_given_twice_is_reported_with_the_value_that_failed(given, capsys):
    """Hydra applies a key's overrides in order (each must be valid, the last is in effect): the message
    names the value that failed, not the first one given, and says the key was given twice."""
    assert main(["--check=config"] + [f"data.train_batch_size={v}" for v in given]) == 2
    err = capsys.readouterr().err
    assert "invalid value for data.train_batch_size = 'abc' (the key is given 2 times" in err, err
    assert "= '4'" not in err and "Value 'abc'" in err
    # the later of two valid values wins, as with Hydra
    assert load("data.train_batch_size=4", "data.train_batch_size=32", check_paths=False).data.train_batch_size == 32


def test_a_config_file_is_parsed_once_until_its_text_changes(tmp_path, monkeypatch):
    """Composing again (a sweep's jobs, --check, the tests) does not parse the YAML again; a file whose
    text changed (even at the same size, within the same clock tick) is read anew, and what one compose's
    overrides changed does not leak into the next."""
    from omegaconf import OmegaConf

    marker = "# parse-count-marker\n"
    conf = tmp_path / "conf"
    conf.mkdir()
    yaml_file = conf / "grpo_trainer.yaml"
    yaml_file.write_text(marker + (ROOT / "conf" / "grpo_trainer.yaml").read_text())
    parses = []
    real_load = OmegaConf.load

    def counting_load(file_):
        if hasattr(file_, "read"):
            text = file_.read()
            file_.seek(0)
        else:
            text = Path(file_).read_text()
        parses.append(marker in text)
        return real_load(file_)

    monkeypatch.setattr(OmegaConf, "load", counting_load)
    assert compose(["trainer.total_epochs=7"], config_dir=conf).trainer.total_epochs == 7
    assert compose([], config_dir=conf).trainer.total_epochs == 30
    assert parses.count(True) == 1
    yaml_file.write_text(yaml_file.read_text().replace("total_epochs: 30", "total_epochs: 31"))
    assert compose([], config_dir=conf).trainer.total_epochs == 31
    assert parses.count(True) == 2


def test_the_disk_cache_is_read_back_rebuilt_on_a_new_key_and_never_needed(tmp_path, monkeypatch):
    """config/loader's cache of the built schema and the parsed YAML: a value is built once per key, a new key
    replaces the older file, a file that does not unpickle is built again, and a folder that cannot be written
    only costs the build."""
    import pickle

    from grpo_dist.config import loader

    monkeypatch.setenv("GRPO_DIST_CACHE", str(tmp_path / "cache"))
    builds = []

    def build(value):
        def _build():
            builds.append(value)
            return value
        return _build

    def cached(kind, key, make):
        data, value = loader._disk_cached(kind, key, make)
        assert pickle.loads(data) == value
        return value

    folder = tmp_path / "cache" / loader.CACHE_SUBDIR
    assert cached("k", b"one", build({"a": 1})) == {"a": 1}
    assert cached("k", b"one", build({"a": 2})) == {"a": 1}  # read back, not built
    assert builds == [{"a": 1}] and len(list(folder.glob("k-*.pkl"))) == 1
    assert cached("k", b"two", build({"a": 3})) == {"a": 3}
    files = list(folder.glob("k-*.pkl"))
    assert len(files) == 1  # the older key's file is gone
    files[0].write_bytes(files[0].read_bytes()[:5])  # cut short
    assert cached("k", b"two", build({"a": 4})) == {"a": 4}
    assert cached("k", b"two", build({"a": 5})) == {"a": 4}
    monkeypatch.setenv("GRPO_DIST_CACHE", str(tmp_path / "a_file" / "cache"))
    (tmp_path / "a_file").write_text("not a folder")
    assert cached("k", b"two", build({"a": 6})) == {"a": 6}


def test_the_schemas_digest_changes_with_any_source_file(tmp_path):
    from grpo_dist.config.loader import tree_digest

    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("Y = 2\n")
    (tmp_path / "pkg" / "notes.txt").write_text("not a source")
    first = tree_digest(tmp_path / "pkg")
    assert tree_digest(tmp_path / "pkg") == first and tree_digest(tmp_path / "pkg", b"lib 2") != first
    (tmp_path / "pkg" / "notes.txt").write_text("changed")
    assert tree_digest(tmp_path / "pkg") == first
    (tmp_path / "pkg" / "sub" / "b.py").write_text("Y = 3\n")
    assert tree_digest(tmp_path / "pkg") != first
    (tmp_path / "pkg" / "sub" / "b.py").write_text("Y = 2\n")
    (tmp_path / "pkg" / "sub" / "b.py").rename(tmp_path / "pkg" / "sub" / "c.py")
    assert tree_digest(tmp_path / "pkg") != first


COMPOSE_TWICE = (
    "import json, sys\n"
    "from omegaconf import OmegaConf\n"
    "from grpo_dist.config.loader import compose\n"
    "from grpo_dist.config.schema import ConfigError\n"
    "cfg = compose(['data.train_batch_size=8', 'actor_rollout_ref.actor.optim.lr=3e-6'])\n"
    "errors = []\n"
    "for bad in (['data.train_batch_size=abc'], ['actor_rollout_ref.actor.no_such=1']):\n"
    "    try:\n"
    "        compose(bad)\n"
    "    except ConfigError as exc:\n"
    "        errors.append(str(exc))\n"
    "c = OmegaConf.to_object(cfg)\n"
    "print(json.dumps([OmegaConf.to_yaml(cfg), errors, type(c).__name__, type(c.actor_rollout_ref.actor).__name__]))\n"
)


def test_a_run_composing_from_the_disk_cache_gets_the_same_configuration_and_messages(tmp_path):
    """The first process builds the schema and parses conf/grpo_trainer.yaml and leaves both in the cache; the
    next one composes from the cache: the same configuration, the same typed objects, the same messages."""
    import json
    import os

    env = {**os.environ, "GRPO_DIST_CACHE": str(tmp_path / "cache")}
    root = Path(__file__).resolve().parents[2]
    outs, written = [], []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", COMPOSE_TWICE], cwd=root, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        names = sorted(p.name.split("-")[0] for p in (tmp_path / "cache" / "config").glob("*.pkl"))
        assert names == ["schema", "yaml"], names
        written.append({p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (tmp_path / "cache" / "config").iterdir()})
    assert written[0] == written[1]  # the second process read the files, it wrote none
    assert outs[0] == outs[1]
    yaml_text, errors, typed, actor = outs[1]
    assert "train_batch_size: 8" in yaml_text and "lr: 3.0e-06" in yaml_text
    assert len(errors) == 2 and "data.train_batch_size" in errors[0] and "no_such" in errors[1]
    assert (typed, actor) == ("GRPOConfig", "ActorConfig")
