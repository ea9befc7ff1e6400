"""The calculator task's tool (``multi_turn.function_tool_path: builtin:calculator/tools``).

One function tool, ``add(a, b)``: the model calls it with the two numbers of the prompt and copies the
text it returns, the exact sum, as its answer.
"""

from __future__ import annotations

from grpo_dist.tools.function_tool import function_tool


def _as_int(value: object, name: str) -> int:
    """``value`` as an int: an int, or a string of an optional sign and digits (surrounding white space
    ignored); ``ValueError`` naming the argument otherwise (floats and booleans included)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value.strip())
    raise ValueError(f"{name} must be an integer, got {value!r}")


@function_tool
def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return str(_as_int(a, "a") + _as_int(b, "b"))
