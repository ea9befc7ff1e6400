"""GPU recipe presets (conf/recipes/*.yaml) and their launchers (scripts/recipes/*.sh).

Each preset composes on top of the project's defaults and passes validation (file checks aside,
or with them against data written by scripts/data/prepare_*.py); its keys hold verl's GSM8K GRPO
recipe values; the launchers pass shellcheck and, in dry-run mode, print commands that compose
and validate to the same configuration (one node, two nodes by Slurm or by a hand-started Ray).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from grpo_dist.config.loader import compose, to_typed
from grpo_dist.config.validate import validate_config
from grpo_dist.main import main as grpo_main
from grpo_dist.main import parse_argv

ROOT = Path(__file__).resolve().parents[2]
RECIPE_DIR = ROOT / "conf" / "recipes"
SCRIPT_DIR = ROOT / "scripts" / "recipes"
ONE_NODE = SCRIPT_DIR / "gsm8k_qwen2.5_0.5b_1node.sh"
TWO_NODES = SCRIPT_DIR / "gsm8k_qwen2.5_0.5b_2nodes.sh"
RECIPE_SCRIPTS = sorted(SCRIPT_DIR.glob("*.sh"))

# the GPU presets of verl's recipes (the CPU recipe on the built-in real model: tests/unit/test_tasks_builtin.py)
RECIPES = sorted(p.stem for p in RECIPE_DIR.glob("*_qwen2.5_*.yaml"))
MODELS = {"0.5b": "Qwen/Qwen2.5-0.5B-Instruct", "1.5b": "Qwen/Qwen2.5-1.5B-Instruct"}

# verl's GSM8K GRPO recipe (examples/grpo_trainer/run_qwen2-7b.sh, run_qwen2-7b_math.sh), in every preset.
VERL_GRPO = {
    "algorithm.adv_estimator": "grpo",
    "algorithm.use_kl_in_reward": False,
    "data.train_batch_size": 1024,
    "data.max_response_length": 1024,
    "data.filter_overlong_prompts": True,
    "data.truncation": "error",
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.use_kl_loss": True,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff": 0.0,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.actor.fsdp_config.param_offload": False,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
    "actor_rollout_ref.ref.fsdp_config.param_offload": True,
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.n": 5,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,
    "trainer.device": "cuda",
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
    "trainer.total_epochs": 15,
    "trainer.total_training_steps": None,  # verl's: the steps come from the 15 epochs
    "trainer.test_freq": 5,
    "trainer.save_freq": 20,
}
PER_DATASET = {
    "gsm8k": {"data.train_files": "~/data/gsm8k/train.parquet", "data.val_files": "~/data/gsm8k/test.parquet",
              "data.max_prompt_length": 512},
    "math": {"data.train_files": "~/data/math/train.parquet", "data.val_files": "~/data/math/test.parquet",
             "data.max_prompt_length": 1024},
}


def load(recipe: str, *overrides: str, check_paths: bool = False):
    cfg = to_typed(compose(list(overrides), config_name=f"recipes/{recipe}"), list(overrides))
    validate_config(cfg, check_paths=check_paths)
    return cfg


def get(cfg, key: str):
    return functools.reduce(getattr, key.split("."), cfg)


def expected_values(recipe: str) -> dict:
    dataset, size = re.fullmatch(r"(gsm8k|math)_qwen2\.5_(0\.5b|1\.5b)", recipe).groups()
    return {**VERL_GRPO, **PER_DATASET[dataset], "actor_rollout_ref.model.path": MODELS[size]}


def test_the_presets_are_there():
    assert {"gsm8k_qwen2.5_0.5b", "gsm8k_qwen2.5_1.5b", "math_qwen2.5_0.5b", "math_qwen2.5_1.5b"} <= set(RECIPES)


@pytest.mark.parametrize("recipe", RECIPES)
def test_preset_composes_and_validates(recipe):
    cfg = load(recipe)
    assert cfg.actor_rollout_ref.rollout.response_length == 1024  # interpolations of the defaults resolve
    # two nodes: the same global batch sizes must split over 16 ranks too
    two = load(recipe, "trainer.nnodes=2")
    assert two.trainer.nnodes * two.trainer.n_gpus_per_node == 16


@pytest.mark.parametrize("recipe", RECIPES)
def test_preset_holds_verls_recipe_values(recipe):
    cfg = load(recipe)
    for key, want in expected_values(recipe).items():
        got = get(cfg, key)
        assert got == pytest.approx(want) if isinstance(want, float) else got == want, f"{recipe}: {key} = {got!r}, want {want!r}"
    # a memory knob the recipe sets for every forward on a GPU
    for key in ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"):
        assert get(cfg, key) in (8, 16, 32, 40), key


@pytest.mark.parametrize("recipe", RECIPES)
def test_preset_starts_from_the_project_defaults(recipe):
    """Keys the preset leaves alone keep conf/grpo_trainer.yaml's values; the file sets only schema keys."""
    base, cfg = compose([]), compose([], config_name=f"recipes/{recipe}")
    preset = OmegaConf.load(RECIPE_DIR / f"{recipe}.yaml")
    assert list(preset.defaults) == ["/grpo_trainer", "_self_"]
    assert (RECIPE_DIR / f"{recipe}.yaml").read_text().startswith("# @package _global_\n")
    for key in ("actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.loss_agg_mode",
                "algorithm.norm_adv_by_std_in_grpo", "actor_rollout_ref.rollout.val_kwargs",
                "trainer.resume_mode", "data.prompt_key"):
        assert OmegaConf.select(cfg, key) == OmegaConf.select(base, key), key
    set_keys = [k for k in _leaf_keys(OmegaConf.to_container(preset)) if not k.startswith("defaults")]
    assert set_keys and all(OmegaConf.select(base, k, default="<absent>") != "<absent>" for k in set_keys)


def _leaf_keys(node, prefix: str = ""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaf_keys(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1]


@pytest.mark.parametrize("recipe", RECIPES)
def test_cli_prints_the_composed_preset(recipe, capsys):
    assert grpo_main(["--config-name", f"recipes/{recipe}", "--cfg", "job"]) == 0
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed.data.train_batch_size == 1024 and printed.actor_rollout_ref.rollout.n == 5
    assert printed.trainer.total_training_steps is None


@pytest.mark.parametrize("recipe", ["gsm8k_qwen2.5_0.5b", "math_qwen2.5_1.5b"])
def test_preset_passes_the_file_checks_with_prepared_data(recipe, tmp_path, monkeypatch):
    """Data written by scripts/data/prepare_*.py to verl's ~/data/<name> paths is what the preset reads."""
    monkeypatch.setenv("HOME", str(tmp_path))
    dataset = recipe.split("_")[0]
    script = ROOT / "scripts" / "data" / f"prepare_{dataset}.py"
    src = tmp_path / "src.jsonl"
    src.write_text(
        '{"question": "1+1?", "answer": "1+1=2\\n#### 2"}\n' if dataset == "gsm8k"
        else '{"problem": "1+1?", "solution": "$\\\\boxed{2}$", "level": "Level 1", "type": "Algebra"}\n')
    proc = subprocess.run([sys.executable, str(script), "--train-file", str(src), "--test-file", str(src)],
                          capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    model = tmp_path / "model"
    model.mkdir()
    cfg = load(recipe, f"actor_rollout_ref.model.path={model}", check_paths=True)
    assert os.path.expanduser(cfg.data.train_files) == str(tmp_path / "data" / dataset / "train.parquet")


# ---------------------------------------------------------------------------------------- launchers


def test_the_launchers_are_there():
    names = {p.name for p in RECIPE_SCRIPTS}
    assert {"gsm8k_qwen2.5_0.5b_1node.sh", "gsm8k_qwen2.5_0.5b_2nodes.sh", "common.sh"} <= names

    # shellcheck runs on them with every other launcher: tests/unit/test_cluster_scripts.py::test_shellcheck


def launcher_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    drop = ("SLURM_", "GRPO_DIST_", "RAY_", "NCCL_", "GLOO_", "HF_", "MODEL_PATH", "RECIPE", "RUN_DIR")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(HOME=str(tmp_path / "home"), HF_HOME=str(tmp_path / "hf"), GRPO_DIST_PYTHON=sys.executable)
    env.update(extra)
    return env


def run_script(script: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def driver_argv(line: str) -> list[str]:
    """The arguments after `python -m grpo_dist.main` in a printed command."""
    argv = shlex.split(line)
    i = argv.index("grpo_dist.main")
    assert argv[i - 1] == "-m"
    return argv[i + 1:]


def validate_argv(argv: list[str]):
    flags, overrides = parse_argv(argv)
    cfg = to_typed(compose(overrides, config_name=flags["config_name"]), overrides)
    validate_config(cfg, check_paths=False)
    return flags, cfg


@pytest.fixture
def model_dir(tmp_path) -> Path:
    d = tmp_path / "Qwen2.5-0.5B-Instruct"
    d.mkdir()
    return d


def test_one_node_dry_run(tmp_path, model_dir):
    proc = run_script(ONE_NODE, "trainer.logger=[console,file,wandb]",
                      env=launcher_env(tmp_path, GRPO_DIST_DRY_RUN="1", MODEL_PATH=str(model_dir)))
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert "\n" not in line and shlex.split(line)[0] == sys.executable
    flags, cfg = validate_argv(driver_argv(line))
    assert flags["config_name"] == "recipes/gsm8k_qwen2.5_0.5b"
    assert cfg.actor_rollout_ref.model.path == str(model_dir)
    assert list(cfg.trainer.logger) == ["console", "file", "wandb"]  # the user's override wins
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node, cfg.trainer.device) == (1, 8, "cuda")


def test_one_node_other_recipe_and_model_from_hf_cache(tmp_path):
    """RECIPE picks another preset; without MODEL_PATH the model comes from the Hugging Face cache."""
    snapshot = tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-1.5B-Instruct" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    refs = snapshot.parents[1] / "refs"
    refs.mkdir()
    (refs / "main").write_text("a" * 40)
    proc = run_script(ONE_NODE, env=launcher_env(tmp_path, GRPO_DIST_DRY_RUN="1", RECIPE="math_qwen2.5_1.5b"))
    assert proc.returncode == 0, proc.stderr
    flags, cfg = validate_argv(driver_argv(proc.stdout.strip()))
    assert flags["config_name"] == "recipes/math_qwen2.5_1.5b"
    assert Path(cfg.actor_rollout_ref.model.path) == snapshot


def test_one_node_without_the_model_stops_before_starting(tmp_path):
    proc = run_script(ONE_NODE, env=launcher_env(tmp_path))
    assert proc.returncode == 2
    assert "Qwen/Qwen2.5-0.5B-Instruct" in proc.stderr and "huggingface-cli download" in proc.stderr
    assert "MODEL_PATH" in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_recipe_is_named(tmp_path, model_dir):
    proc = run_script(ONE_NODE, env=launcher_env(tmp_path, RECIPE="nope"))
    assert proc.returncode == 2 and "RECIPE=nope" in proc.stderr


def test_two_nodes_by_hand_started_ray(tmp_path, model_dir):
    run_dir = tmp_path / "shared" / "run"
    proc = run_script(TWO_NODES, "ray", "trainer.save_freq=10",
                      env=launcher_env(tmp_path, GRPO_DIST_DRY_RUN="1", MODEL_PATH=str(model_dir), RUN_DIR=str(run_dir)))
    assert proc.returncode == 0, proc.stderr
    flags, cfg = validate_argv(driver_argv(proc.stdout.strip()))
    assert flags["config_name"] == "recipes/gsm8k_qwen2.5_0.5b"
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node, cfg.trainer.device) == (2, 8, "cuda")
    assert cfg.ray_kwargs.ray_init.address == "auto"
    assert cfg.trainer.default_local_dir == str(run_dir) and cfg.trainer.save_freq == 10


def test_two_nodes_by_slurm(tmp_path, model_dir):
    """The launcher's sbatch command, then grpo_dist.sbatch's own dry run of it: the driver line validates."""
    env = launcher_env(tmp_path, GRPO_DIST_DRY_RUN="1", MODEL_PATH=str(model_dir), GRPO_DIST_PARTITION="gpu")
    proc = run_script(TWO_NODES, "trainer.total_epochs=3", env=env)
    assert proc.returncode == 0, proc.stderr
    sbatch = shlex.split(next(ln for ln in proc.stdout.splitlines() if ln.startswith("sbatch ")))
    for flag in ("--nodes=2", "--gpus-per-node=8", "--time=24:00:00", "--partition=gpu"):
        assert flag in sbatch, (flag, sbatch)
    i = next(k for k, a in enumerate(sbatch) if a.endswith("grpo_dist.sbatch"))
    job_args = sbatch[i + 1:]
    assert job_args[0] == "--config-name=recipes/gsm8k_qwen2.5_0.5b"
    assert f"trainer.default_local_dir={ROOT}/checkpoints/recipes/gsm8k_qwen2.5_0.5b_2nodes" in job_args

    job_env = launcher_env(tmp_path, GRPO_DIST_DRY_RUN="1", GRPO_DIST_ROOT=str(ROOT), SLURM_JOB_NODELIST="node[01-02]",
                           SLURM_NNODES="2", SLURM_GPUS_ON_NODE="8", GRPO_DIST_IFNAME="ib0",
                           GRPO_DIST_HEAD_IP="10.0.0.1")
    job = subprocess.run(["bash", str(sbatch[i]), *job_args], capture_output=True, text=True, env=job_env,
                         cwd=ROOT, timeout=120)
    assert job.returncode == 0, job.stderr
    driver = next(ln for ln in job.stdout.splitlines() if ln.startswith("driver"))
    flags, cfg = validate_argv(driver_argv(driver.split(None, 1)[1]))
    assert flags["config_name"] == "recipes/gsm8k_qwen2.5_0.5b"
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node, cfg.trainer.total_epochs) == (2, 8, 3)
    assert cfg.ray_kwargs.ray_init.address == "10.0.0.1:6379"
    assert cfg.actor_rollout_ref.model.path == str(model_dir)


def test_two_nodes_rejects_an_unknown_mode(tmp_path, model_dir):
    proc = run_script(TWO_NODES, "kubernetes", env=launcher_env(tmp_path, MODEL_PATH=str(model_dir)))
    assert proc.returncode == 2 and "slurm | ray" in proc.stderr


# -------------------------------------------------------------------------------------------- docs


def test_docs_name_existing_presets_and_scripts():
    text = (ROOT / "docs" / "recipes.md").read_text()
    tokens = {t.rstrip(".").removesuffix(".yaml") for t in re.findall(r"recipes/([A-Za-z0-9_.-]*)", text)}
    presets = {t for t in tokens if t and t != "NAME" and not t.endswith((".sh", ".md"))}
    assert set(RECIPES) <= presets, "every preset is documented"
    for name in presets:
        assert (RECIPE_DIR / f"{name}.yaml").is_file(), f"docs/recipes.md names recipes/{name}, which does not exist"
    for path in set(re.findall(r"\b(scripts/[\w./-]+\.(?:sh|py))", text)):
        assert (ROOT / path).is_file(), path
    assert "has not yet run these recipes on GPUs" in text  # the status is stated, up front
    assert text.index("not yet run") < text.index("## The values")
