"""Rule-based scorers (response text -> float) and the registry that maps data sources to them.

A scorer is a pure, module-level function ``score(solution_str, ground_truth, extra_info=None) -> float``
(module-level so that reward worker processes can import it by reference). Register one for a
data source with::

    from grpo_dist.rewards import register_scorer

    @register_scorer("my_task")            # or register_scorer("my_task")(fn)
    def my_task_score(solution_str, ground_truth, extra_info=None) -> float: ...

For a data source without a registered scorer, point ``custom_reward_function.path`` at a file that
defines ``fn(data_source, solution_str, ground_truth, extra_info=None) -> float | dict`` (verl's
signature) instead.
"""

from __future__ import annotations

import fnmatch
import logging
import re
import threading
from typing import Any, Callable

logger = logging.getLogger(__name__)

ScoreFn = Callable[..., float]


# ----------------------------------------------------------------------------------------------
# GSM8K
# ----------------------------------------------------------------------------------------------

# verl matches only the tail of the response (speed); the final answer is expected at the end.
_GSM8K_CLIP_CHARS = 300
_GSM8K_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_gsm8k_answer(solution_str: str) -> str | None:
    """The number after the last ``#### `` in the last 300 characters, commas and ``$`` removed
    (verl's ``strict`` extraction); None when there is none."""
    tail = solution_str[-_GSM8K_CLIP_CHARS:]
    matches = _GSM8K_STRICT.findall(tail)
    if not matches:
        return None
    return matches[-1].replace(",", "").replace("$", "")


def gsm8k_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                *, format_score: float = 0.0, score: float = 1.0) -> float:
    """verl's GSM8K reward: ``score`` if the strict ``#### <number>`` answer equals the ground truth
    as a string (commas removed on both sides), ``format_score`` if it is present but different,
    0.0 if there is none. "72" and "72.0" differ, as in verl."""
    answer = extract_gsm8k_answer(solution_str)
    if answer is None:
        return 0.0
    truth = str(ground_truth).strip().replace(",", "")
    return float(score) if answer == truth else float(format_score)


# ----------------------------------------------------------------------------------------------
# MATH
# ----------------------------------------------------------------------------------------------


def last_boxed_content(text: str) -> str | None:
    """What is inside the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``) of ``text``,
    braces balanced; None when there is no complete one."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    if text.startswith(" ", i):  # "\boxed 5": up to the closing "$" or the end of the line
        content = re.split(r"[$\n]", text[i + 1:], maxsplit=1)[0].strip()
        return content or None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def normalize_math_answer(answer: str) -> str:
    """A light normal form of a LaTeX answer for string comparison (spacing, ``\\left``/``\\right``,
    ``dfrac``/``tfrac``, ``\\text{}``, degrees, percent, ``$``, a trailing period, a leading ``x=``)."""
    s = str(answer).strip()
    s = _TEXT_CMD.sub(r"\1", s)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\:", ""),
                     ("\\ ", ""), ("dfrac", "frac"), ("tfrac", "frac"), ("^{\\circ}", ""), ("^\\circ", ""),
                     ("\\%", ""), ("%", ""), ("\\$", ""), ("$", "")):
        s = s.replace(old, new)
    s = re.sub(r"\s+", "", s).rstrip(".")
    s = re.sub(r"^[a-zA-Z]=", "", s)
    if s.startswith("."):
        s = "0" + s
    return s


_math_verify_missing_logged = False


def math_verify_equal(ground_truth: str, answer: str) -> bool:
    """Whether ``answer`` equals ``ground_truth`` by math-verify (``parse`` each as a boxed LaTeX
    answer, then ``verify``). False when math-verify is not installed or fails on the input."""
    global _math_verify_missing_logged
    try:
        from math_verify import parse, verify
    except ImportError:
        if not _math_verify_missing_logged:
            logger.warning("math-verify is not installed: MATH answers are compared as normalised strings")
            _math_verify_missing_logged = True
        return False
    # math-verify's time limits use SIGALRM, which only the main thread may set.
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold = parse("\\boxed{" + ground_truth + "}", parsing_timeout=limit)
        pred = parse("\\boxed{" + answer + "}", parsing_timeout=limit)
        if not gold or not pred:
            return False
        return bool(verify(gold, pred, timeout_seconds=limit))
    except Exception as exc:  # math-verify can raise on odd LaTeX or on its own time limit
        logger.debug("math-verify failed on %r vs %r: %s", answer, ground_truth, exc)
        return False


def math_score(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """MATH-style reward: 1.0 if the last ``\\boxed{}`` of the response equals the ground truth, else 0.0.

    Equal means equal after :func:`normalize_math_answer`, or mathematically equal by math-verify
    (``\\boxed{\\frac{1}{2}}`` matches ``0.5``). A ground truth that is itself a full solution with a
    ``\\boxed{}`` is reduced to its boxed content. No boxed answer scores 0.0.
    """
    answer = last_boxed_content(solution_str)
    if answer is None:
        return 0.0
    truth = str(ground_truth)
    boxed_truth = last_boxed_content(truth)
    if boxed_truth is not None:
        truth = boxed_truth
    if normalize_math_answer(answer) == normalize_math_answer(truth):
        return 1.0
    return 1.0 if math_verify_equal(truth, answer) else 0.0


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------


class ScorerRegistry:
    """Data source -> scorer. A pattern is an exact data-source name, or a glob (``*``, ``?``, ``[``)
    tried in registration order after the exact names."""

    def __init__(self):
        self._exact: dict[str, ScoreFn] = {}
        self._globs: list[tuple[str, ScoreFn]] = []

    def register(self, *patterns: str, override: bool = False) -> Callable[[ScoreFn], ScoreFn]:
        """Decorator registering a scorer under one or more data-source patterns.

        Registering a pattern twice raises ``ValueError`` unless ``override=True``.
        """
        if not patterns or not all(isinstance(p, str) and p for p in patterns):
            raise ValueError(f"register_scorer needs one or more non-empty data-source names, got {patterns!r}")

        def decorator(fn: ScoreFn) -> ScoreFn:
            if not callable(fn):
                raise ValueError(f"register_scorer({', '.join(map(repr, patterns))}) needs a function, got {fn!r}")
            for pattern in patterns:
                existing = self._exact.get(pattern) or dict(self._globs).get(pattern)
                if existing is not None and existing is not fn and not override:
                    raise ValueError(
                        f"data source {pattern!r} already has the scorer {_fn_name(existing)}; "
                        f"pass override=True to replace it"
                    )
                if any(ch in pattern for ch in "*?["):
                    self._globs = [(p, f) for p, f in self._globs if p != pattern] + [(pattern, fn)]
                else:
                    self._exact[pattern] = fn
            return fn

        return decorator

    def get(self, data_source: str) -> ScoreFn:
        """The scorer for ``data_source``; ``ValueError`` naming it and the known ones when none."""
        fn = self._exact.get(data_source)
        if fn is not None:
            return fn
        for pattern, fn in self._globs:
            if fnmatch.fnmatchcase(data_source, pattern):
                return fn
        raise ValueError(
            f"no reward scorer for data_source {data_source!r}; known data sources: "
            f"{', '.join(self.known()) or '(none)'}. For another data source, write "
            f"fn(data_source, solution_str, ground_truth, extra_info=None) -> float in a .py file and set "
            f"custom_reward_function.path=<that file> and custom_reward_function.name=<fn>, or register a "
            f"scorer with grpo_dist.rewards.register_scorer({data_source!r})(score_fn)."
        )

    def functions(self) -> list[ScoreFn]:
        """The registered scorers, each once."""
        seen: dict[int, ScoreFn] = {}
        for fn in list(self._exact.values()) + [f for _, f in self._globs]:
            seen.setdefault(id(fn), fn)
        return list(seen.values())

    def known(self) -> list[str]:
        return sorted(self._exact) + [p for p, _ in self._globs]

    def __contains__(self, data_source: str) -> bool:
        try:
            self.get(data_source)
        except ValueError:
            return False
        return True


def _fn_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


DEFAULT_REGISTRY = ScorerRegistry()
register_scorer = DEFAULT_REGISTRY.register
get_scorer = DEFAULT_REGISTRY.get

register_scorer("openai/gsm8k", "gsm8k")(gsm8k_score)
register_scorer(
    "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math", "MATH",
)(math_score)


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any,
                          extra_info: dict | None = None) -> float:
    """verl's ``default_compute_score``: the registered scorer of ``data_source`` applied to the response."""
    return get_scorer(data_source)(solution_str, ground_truth, extra_info)
