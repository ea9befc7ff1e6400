"""gsm8k / math scorers on hand cases, and the data-source registry."""

import pytest

from grpo_dist.rewards import ScorerRegistry, default_compute_score, get_scorer, gsm8k_score, math_score
from grpo_dist.rewards.scorers import last_boxed_content, math_verify_equal


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("so the total is 72.\n#### 72", "72", 1.0),
        ("#### 1,234", "1234", 1.0),  # commas removed
        ("#### -5", "-5", 1.0),
        ("first #### 3 then corrected #### 4", "4", 1.0),  # the last one counts
        ("#### 71", "72", 0.0),  # wrong
        ("The answer is 72", "72", 0.0),  # no strict format
        ("####72", "72", 0.0),  # strict: needs the space
        ("#### 72.0", "72", 0.0),  # string comparison, as verl
        ("", "72", 0.0),
    ],
)
def test_gsm8k(response, truth, expected):
    assert gsm8k_score(response, truth) == expected


def test_gsm8k_format_score():
    assert gsm8k_score("#### 1", "2", format_score=0.1) == 0.1
    assert gsm8k_score("no answer", "2", format_score=0.1) == 0.0


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("thus \\boxed{\\frac{1}{2}}", "0.5", 1.0),  # math-verify equivalence
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac12", 1.0),
        ("\\boxed{x^2 + 1}", "1+x^2", 1.0),
        ("\\boxed{3} wait, no: \\boxed{4}", "4", 1.0),  # the last box
        ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),  # wrong
        ("the answer is 0.5", "0.5", 0.0),  # no box
        ("\\boxed{\\frac{1}{2}", "0.5", 0.0),  # unbalanced
        ("\\boxed{10\\%}", "10", 1.0),  # normalised string compare
        ("\\boxed{\\text{Monday}}", "Monday", 1.0),
        ("\\boxed{Tuesday}", "Monday", 0.0),
        ("\\boxed{5}", "The answer is $\\boxed{5}$.", 1.0),  # a solution as ground truth
    ],
)
def test_math(response, truth, expected):
    assert math_score(response, truth) == expected


def test_last_boxed_content():
    assert last_boxed_content("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert last_boxed_content("\\boxed{1} and \\fbox{2}") == "2"
    assert last_boxed_content("$\\boxed 7$") == "7"
    assert last_boxed_content("nothing") is None


def test_math_falls_back_when_math_verify_fails(monkeypatch):
    import math_verify

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(math_verify, "parse", broken)
    assert math_verify_equal("0.5", "\\frac{1}{2}") is False
    assert math_score("\\boxed{\\frac{1}{2}}", "0.5") == 0.0  # only math-verify could see this
    assert math_score("\\boxed{ \\frac{1}{2} }", "\\dfrac{1}{2}") == 1.0  # the string compare still works


@pytest.mark.parametrize("source", ["openai/gsm8k", "gsm8k"])
def test_registry_gsm8k_names(source):
    assert get_scorer(source) is gsm8k_score


@pytest.mark.parametrize(
    "source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math"]
)
def test_registry_math_names(source):
    assert get_scorer(source) is math_score


def test_unknown_data_source_message():
    with pytest.raises(ValueError) as err:
        get_scorer("my/new-task")
    msg = str(err.value)
    assert "'my/new-task'" in msg and "openai/gsm8k" in msg and "lighteval/MATH" in msg
    assert "custom_reward_function.path" in msg


def test_register_exact_glob_and_duplicates():
    reg = ScorerRegistry()

    def a(solution_str, ground_truth, extra_info=None):
        return 1.0

    def b(solution_str, ground_truth, extra_info=None):
        return 0.5

    assert reg.register("countdown")(a) is a
    reg.register("countdown-*")(b)
    assert reg.get("countdown") is a
    assert reg.get("countdown-3to4") is b
    with pytest.raises(ValueError, match="already has the scorer"):
        reg.register("countdown")(b)
    reg.register("countdown", override=True)(b)
    assert reg.get("countdown") is b
    assert "countdown" in reg and "other" not in reg


def test_default_compute_score_dispatches():
    assert default_compute_score("openai/gsm8k", "#### 3", "3") == 1.0
    assert default_compute_score("HuggingFaceH4/MATH-500", "\\boxed{3}", "4") == 0.0
