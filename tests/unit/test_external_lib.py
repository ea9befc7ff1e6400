"""verl's ``external_lib`` keys: the modules a run's models need imported (e.g. to register a model class),
checked before anything starts and imported by the driver and by every model and rollout worker
(tests/e2e/test_train_e2e.py checks the processes of a real run)."""

from __future__ import annotations

import sys

import pytest

from grpo_dist.config.launch import launch_plan
from grpo_dist.utils.imports import import_modules
from tests.configs import cfg_of, refused

POLICY = "actor_rollout_ref.model.external_lib"


def test_a_module_that_is_not_there_is_refused_before_anything_starts_naming_the_key():
    msg = refused(f"{POLICY}=no_such_models_pkg.register", check_paths=True)
    assert msg.startswith(f"{POLICY} = 'no_such_models_pkg.register' is not valid") and "PYTHONPATH" in msg, msg
    # --check=config validates a launch script away from its machine: the name's form only
    assert launch_plan(cfg_of(f"{POLICY}=no_such_models_pkg.register")).external_libs == ("no_such_models_pkg.register",)


@pytest.mark.parametrize("value", ["3", "'not a module'", "[json, 7]", "{a: b}"])
def test_a_value_that_names_no_module_is_refused_saying_what_is_valid(value):
    msg = refused(f"{POLICY}={value}")
    assert msg.startswith(f"{POLICY} = ") and "a module name" in msg and "list of module names" in msg, msg


def test_the_run_imports_the_modules_of_its_models_each_once():
    # the reward model's key defaults to the policy's (verl's interpolation); a critic's counts when it trains one
    plan = launch_plan(cfg_of(f"{POLICY}=[json, json.decoder]", check_paths=True))
    assert plan.external_libs == ("json", "json.decoder")
    assert launch_plan(cfg_of()).external_libs == ()
    no_critic = cfg_of("critic.model.external_lib=no_such_critic_lib")  # no critic in a GRPO run: not imported
    assert launch_plan(no_critic).external_libs == ()
    ppo = cfg_of("algorithm.adv_estimator=gae", f"{POLICY}=json", "critic.model.external_lib=[csv, json]",
                 check_paths=True)
    assert launch_plan(ppo).external_libs == ("json", "csv")


def test_importing_them_says_which_module_failed_where_and_why(tmp_path, monkeypatch):
    (tmp_path / "registers_ok.py").write_text("import sys\nsys.modules[__name__].REGISTERED = True\n")
    (tmp_path / "registers_badly.py").write_text("raise RuntimeError('the model class needs flash_attn')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import_modules(["registers_ok"], where="in the driver")
    assert sys.modules["registers_ok"].REGISTERED
    with pytest.raises(ValueError) as info:
        import_modules(["registers_ok", "registers_badly"], where="in a worker process")
    msg = str(info.value)
    assert msg.startswith("external_lib: module 'registers_badly' does not import in a worker process: RuntimeError: "
                          "the model class needs flash_attn"), msg
