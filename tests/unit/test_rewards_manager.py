"""RewardScorer: parallel scoring in worker processes, per-sample time limits, error handling."""

import time

import pytest

from grpo_dist.rewards import CustomRewardFn, RewardError, RewardScorer

# One user reward file whose behaviour is picked by the response text.
BEHAVE = '''
import math, os, time

def behave(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    if solution_str == "raise":
        return 1 / 0
    if solution_str == "nan":
        return math.nan
    if solution_str == "none":
        return None
    if solution_str == "str":
        return "high"
    if solution_str == "huge":
        return 10**400
    if solution_str == "hugefrac":
        import fractions
        return fractions.Fraction(10**400, 3)
    if solution_str == "badsteps":
        return {"score": 1.0, "step_rewards": [0.5, "good"]}
    if solution_str == "infsteps":
        return {"score": 1.0, "step_rewards": [float("inf")]}
    if solution_str == "nokey":
        return {"acc": 1.0}
    if solution_str == "hang":
        time.sleep(10)
    if solution_str == "exit":
        os._exit(3)
    if solution_str.startswith("slow"):
        time.sleep(0.2)
    return {"score": float(solution_str == ground_truth) + bonus, "pid": os.getpid(),
            "source": data_source}
'''

TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def behave_fn(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "behave.py"
    path.write_text(BEHAVE)
    return CustomRewardFn(str(path), "behave")


@pytest.fixture(scope="module")
def zero_scorer(behave_fn):
    with RewardScorer(behave_fn, num_workers=2, timeout_s=TIMEOUT_S, on_error="zero") as scorer:
        yield scorer


@pytest.fixture(scope="module")
def raise_scorer(behave_fn):
    with RewardScorer(behave_fn, num_workers=1, timeout_s=TIMEOUT_S, on_error="raise") as scorer:
        yield scorer


def score(scorer, responses, truths=None):
    n = len(responses)
    return scorer.score_batch([f"d{i}" for i in range(n)], responses, truths or ["a"] * n, [{}] * n)


def test_registry_scores_in_order_across_data_sources():
    with RewardScorer(None, num_workers=2, timeout_s=30, on_error="raise") as scorer:
        sources = ["openai/gsm8k", "lighteval/MATH", "gsm8k", "HuggingFaceH4/MATH-500"] * 5
        responses = ["#### 1", "\\boxed{\\frac{1}{2}}", "#### 2", "\\boxed{3}"] * 5
        truths = ["1", "0.5", "3", "3"] * 5
        scores, extra, stats = scorer.score_batch(sources, responses, truths, None)
    assert scores == [1.0, 1.0, 0.0, 1.0] * 5
    assert extra == {"acc": scores}  # a number-returning scorer's score is its acc (verl's reward managers)
    assert stats == {"reward/num_errors": 0, "reward/num_timeouts": 0}


def test_unknown_data_source_fails_before_scoring():
    scorer = RewardScorer(None, num_workers=1, timeout_s=5, on_error="zero")
    with pytest.raises(ValueError, match="no reward scorer for data_source 'mystery'"):
        scorer.score_batch(["gsm8k", "mystery"], ["#### 1", "x"], ["1", "1"], None)
    assert scorer._workers == []  # nothing was started
    scorer.close()


def test_parallel_in_order_with_extras(zero_scorer):
    responses = [f"slow{i}" for i in range(8)]
    truths = [f"slow{i}" if i % 2 == 0 else "no" for i in range(8)]
    score(zero_scorer, ["a", "a"])  # the workers are started: time the scoring only
    start = time.monotonic()
    scores, extra, stats = score(zero_scorer, responses, truths)
    elapsed = time.monotonic() - start
    assert scores == [1.0, 0.0] * 4
    assert extra["source"] == [f"d{i}" for i in range(8)]
    assert len(set(extra["pid"])) == 2  # both workers took samples
    assert elapsed < 8 * 0.2  # in parallel: less than the serial time
    assert stats == {"reward/num_errors": 0, "reward/num_timeouts": 0}


def test_custom_fn_kwargs_are_passed(behave_fn):
    fn = CustomRewardFn(behave_fn.path, behave_fn.name, kwargs={"bonus": 0.5})
    with RewardScorer(fn, num_workers=1, timeout_s=5, on_error="raise") as scorer:
        assert score(scorer, ["a", "b"])[0] == [1.5, 0.5]


@pytest.mark.parametrize(
    "bad, what",
    [
        ("raise", "raised ZeroDivisionError: division by zero"),
        ("nan", "returned nan"),
        ("none", "returned None"),
        ("str", "returned a str ('high'), not a number"),
        ("nokey", "returned a dict without a 'score' key (keys: acc)"),
        ("exit", "its worker process died (exit code 3)"),
        ("huge", "returned 1000000000000000000000000000000000000000..., which is not a float (OverflowError"),
        ("hugefrac", "which is not a float (OverflowError"),
        ("badsteps", "returned step_rewards[1] = a str ('good'), not a number"),
        ("infsteps", "returned step_rewards[0] = inf"),
    ],
)
def test_bad_result_with_on_error_raise(raise_scorer, bad, what):
    with pytest.raises(RewardError) as err:
        score(raise_scorer, ["a", "b", bad])
    msg = str(err.value)
    assert "\n" not in msg
    assert "behave from " in msg and "behave.py" in msg
    assert "sample 2 of the batch (data_source='d2')" in msg
    assert what.replace("raised ", "") in msg


@pytest.mark.parametrize("bad", ["raise", "nan", "none", "str", "nokey", "exit", "huge", "badsteps"])
def test_bad_result_with_on_error_zero(zero_scorer, bad):
    scores, extra, stats = score(zero_scorer, ["a", bad, "a", "b"])
    assert scores == [1.0, 0.0, 1.0, 0.0]
    assert stats == {"reward/num_errors": 1, "reward/num_timeouts": 0}
    assert extra["source"] == ["d0", None, "d2", "d3"]


def test_message_names_the_row_and_the_start_of_the_response(raise_scorer):
    long_response = "huge"
    with pytest.raises(RewardError) as err:
        raise_scorer.score_batch(["d0", "src/x"], ["a", long_response], ["a", "a"], [{}, {"index": 17}])
    msg = str(err.value)
    assert "sample 1 of the batch (data_source='src/x'): returned 1000" in msg
    assert msg.endswith("(row index 17, response 'huge')")
    assert "OverflowError" in msg and "\n" not in msg and len(msg) < 600


def test_hung_sample_times_out_with_on_error_zero(zero_scorer):
    start = time.monotonic()
    scores, _, stats = score(zero_scorer, ["a", "hang", "a", "b", "a", "hang"])
    elapsed = time.monotonic() - start
    assert scores == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert stats == {"reward/num_errors": 0, "reward/num_timeouts": 2}
    assert elapsed < 4 * TIMEOUT_S
    # the killed workers were replaced: the scorer still works
    assert score(zero_scorer, ["a", "b"])[0] == [1.0, 0.0]


def test_hung_sample_times_out_with_on_error_raise(raise_scorer):
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"sample 1 of the batch \(data_source='d1'\): timed out after 1 s"):
        score(raise_scorer, ["a", "hang", "a"])
    assert time.monotonic() - start < 4 * TIMEOUT_S
    assert score(raise_scorer, ["a", "b"])[0] == [1.0, 0.0]


def test_in_process_mode_and_its_limits(behave_fn):
    scorer = RewardScorer(behave_fn, num_workers=0, timeout_s=None, on_error="zero")
    scores, _, stats = score(scorer, ["a", "raise", "b"])
    assert scores == [1.0, 0.0, 0.0] and stats["reward/num_errors"] == 1
    assert scorer._workers == []
    with pytest.raises(ValueError, match="cannot enforce timeout_s"):
        RewardScorer(behave_fn, num_workers=0, timeout_s=1.0, on_error="zero")


def test_unpicklable_function_is_rejected():
    with pytest.raises(ValueError, match="custom_reward_function.path"):
        RewardScorer(lambda data_source, solution_str, ground_truth, extra_info=None: 1.0,
                     num_workers=1, timeout_s=1.0, on_error="raise")


def test_mismatched_lengths():
    scorer = RewardScorer(None, num_workers=1, timeout_s=1.0, on_error="raise")
    with pytest.raises(ValueError, match="different lengths"):
        scorer.score_batch(["gsm8k"], ["a", "b"], ["1", "2"], None)
def test_worker_exits_quietly_when_the_parent_is_gone():
    """A run that ends while a scoring process starts must not print that process's traceback."""
    import multiprocessing
    import signal

    from grpo_dist.rewards.pool import _worker_main

    parent, child = multiprocessing.Pipe(duplex=True)
    parent.close()
    old = signal.getsignal(signal.SIGINT)
    try:
        assert _worker_main(child, []) is None  # BrokenPipeError on "ready" -> return, no raise
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_raise_is_shown_at_the_users_file_and_line(raise_scorer, behave_fn, tmp_path):
    """The line of the user's file that raised, also when the raise comes from a library it called;
    a signature verl's keywords do not fit is shown at the function's def."""
    line = next(i for i, text in enumerate(BEHAVE.splitlines(), start=1) if "1 / 0" in text)
    with pytest.raises(RewardError) as err:
        score(raise_scorer, ["raise"])
    assert f"raised ZeroDivisionError: division by zero at {behave_fn.path}:{line} (in behave)" in str(err.value)

    lib = tmp_path / "calls_json.py"
    lib.write_text("import json\n\n\ndef score(data_source, solution_str, ground_truth, extra_info=None):\n"
                   "    return json.loads(solution_str)\n\n\ndef positional(text):\n    return 1.0\n")
    with RewardScorer(CustomRewardFn(str(lib), "score"), num_workers=0, timeout_s=None, on_error="raise") as scorer:
        with pytest.raises(RewardError, match=rf"raised JSONDecodeError: .* at {lib}:5 \(in score\)"):
            score(scorer, ["not json"])
    with RewardScorer(CustomRewardFn(str(lib), "positional"), num_workers=0, timeout_s=None, on_error="raise") as s:
        with pytest.raises(RewardError, match=rf"raised TypeError: .*'data_source'.* when called \(positional is "
                                              rf"defined at {lib}:8\)"):
            score(s, ["x"])


def test_a_returned_number_is_also_the_samples_acc_as_verls_reward_managers_set_it():
    """A number-returning function's samples carry ``acc`` = their score (a failed one its 0.0); with dict results
    in the batch, only the samples that returned a number get one (a dict's keys are its own)."""
    def numbers(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "boom":
            raise ValueError("no")
        return float(solution_str == ground_truth)

    def mixed(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 0.5, "pred": solution_str} if solution_str == "d" else numbers(data_source, solution_str, ground_truth)

    with RewardScorer(numbers, num_workers=0, timeout_s=None, on_error="zero") as scorer:
        scores, extra, _ = scorer.score_batch(["s"] * 3, ["a", "boom", "b"], ["a"] * 3, None)
    assert scores == [1.0, 0.0, 0.0] and extra == {"acc": [1.0, 0.0, 0.0]}
    with RewardScorer(mixed, num_workers=0, timeout_s=None, on_error="zero") as scorer:
        scores, extra, _ = scorer.score_batch(["s"] * 3, ["a", "boom", "d"], ["a"] * 3, None)
    assert scores == [1.0, 0.0, 0.5] and extra == {"acc": [1.0, None, None], "pred": [None, None, "d"]}
