"""load_custom_reward_fn: loading a user file by path, and its errors."""

import pytest

from grpo_dist.rewards import load_custom_reward_fn


def test_loads_function_by_path(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(solution_str == ground_truth), 'len': len(solution_str)}\n"
    )
    fn = load_custom_reward_fn(str(path), "compute_score")
    assert fn("d", "ab", "ab") == {"score": 1.0, "len": 2}


def test_missing_file_lists_py_files_nearby(tmp_path):
    (tmp_path / "reward.py").write_text("")
    with pytest.raises(ValueError) as err:
        load_custom_reward_fn(str(tmp_path / "rewrd.py"), "compute_score")
    msg = str(err.value)
    assert "custom_reward_function.path" in msg and "rewrd.py: file not found" in msg
    assert "reward.py" in msg


def test_missing_function_lists_defined_functions(tmp_path):
    path = tmp_path / "r.py"
    path.write_text("import os\nX = 1\ndef score_a(*a): return 1\ndef score_b(*a): return 0\ndef _private(): pass\n")
    with pytest.raises(ValueError) as err:
        load_custom_reward_fn(str(path), "compute_score")
    msg = str(err.value)
    assert "custom_reward_function.name='compute_score'" in msg
    assert "Functions it defines: score_a, score_b" in msg
    with pytest.raises(ValueError, match="defines a int, not a function"):
        load_custom_reward_fn(str(path), "X")


def test_import_error_is_one_clear_line(tmp_path):
    path = tmp_path / "r.py"
    path.write_text("def f(:\n    pass\n")
    with pytest.raises(ValueError, match=r"importing the file failed \(line 1\): SyntaxError"):
        load_custom_reward_fn(str(path), "f")
    path.write_text("import not_a_module_xyz\n")
    with pytest.raises(ValueError, match="ModuleNotFoundError: No module named 'not_a_module_xyz'"):
        load_custom_reward_fn(str(path), "f")
