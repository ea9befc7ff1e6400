"""Where the raw configuration is read: the goal is config/ alone (it resolves the configuration into typed
plans and settings once; everything else takes those). Until the rest of the package gets there, this test
holds the line: no module outside config/ may add a function that takes the configuration object
(a parameter annotated ``GRPOConfig``, or called ``cfg``), and a module that drops below its count must lower it here, so the
count only goes down. ``python -m tests.unit.test_config_reads`` prints today's counts.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "grpo_dist"

#: Functions outside config/ that take the raw configuration, per module (relative to grpo_dist/).
#: Lower a number when a module reads less; never raise one (move the reading into config/ instead).
ALLOWED: dict[str, int] = {
    "trainer/build.py": 34,
    "trainer/run.py": 5,
    "trainer/roles.py": 4,
    "trainer/plan.py": 3,
    "trainer/driver.py": 1,
    "trainer/reward_stage.py": 1,
}


def config_readers(pkg: Path) -> dict[str, list[str]]:
    """``{module: [function names]}`` of the functions outside ``config/`` with a ``GRPOConfig`` (or ``cfg``) parameter."""
    out: dict[str, list[str]] = {}
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        if rel.parts[0] == "config":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            if any(a.arg == "cfg" or (a.annotation is not None and "GRPOConfig" in ast.unparse(a.annotation))
                   for a in args):
                out.setdefault(rel.as_posix(), []).append(node.name)
    return out


def over_the_line(found: dict[str, list[str]], allowed: dict[str, int]) -> list[str]:
    problems = []
    for module, names in sorted(found.items()):
        limit = allowed.get(module, 0)
        if len(names) > limit:
            problems.append(f"{module}: {len(names)} functions take the raw configuration (allowed {limit}: {names}); "
                            "resolve what they need in config/ and pass that instead")
    for module, limit in sorted(allowed.items()):
        if len(found.get(module, [])) < limit:
            problems.append(f"{module}: now {len(found.get(module, []))} functions take the raw configuration; "
                            f"lower its count in ALLOWED from {limit}")
    return problems


def test_no_new_raw_configuration_reads_outside_config():
    problems = over_the_line(config_readers(PKG), ALLOWED)
    assert problems == [], "\n".join(problems)


def test_the_check_finds_a_new_reader_and_a_stale_count(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "trainer").mkdir()
    (tmp_path / "config" / "x.py").write_text("def f(cfg: GRPOConfig): pass\n")
    (tmp_path / "trainer" / "a.py").write_text(textwrap.dedent("""
        def reads(cfg: GRPOConfig) -> int: return 1
        def takes_a_plan(plan: Plan) -> int: return 2
        def unannotated(cfg): return 3
        class C:
            def m(self, *, cfg: "GRPOConfig"): pass
    """))
    found = config_readers(tmp_path)
    assert found == {"trainer/a.py": ["reads", "unannotated", "m"]}
    assert over_the_line(found, {"trainer/a.py": 3}) == []
    assert over_the_line(found, {"trainer/a.py": 2})[0].startswith("trainer/a.py: 3 functions take the raw configuration")
    assert over_the_line(found, {"trainer/a.py": 4}) == [
        "trainer/a.py: now 3 functions take the raw configuration; lower its count in ALLOWED from 4"]


if __name__ == "__main__":
    for module, names in config_readers(PKG).items():
        print(f"{len(names):3d}  {module}: {', '.join(names)}")
