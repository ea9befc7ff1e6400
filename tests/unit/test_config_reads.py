"""Where the raw configuration is read: config/ alone. It validates the configuration and resolves it into the
run specification (:func:`grpo_dist.config.spec.resolve`), whose fields, plans and settings everything else
takes. This test holds the line, as the layering test holds the layers: no function outside config/ takes the
configuration object (a parameter annotated ``GRPOConfig``, or called ``cfg``), and no code outside config/
reaches into the spec for the configuration it keeps privately (``._cfg``). ``python -m
tests.unit.test_config_reads`` lists what it finds.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "grpo_dist"

PRIVATE = "_cfg"
"""The attribute under which :class:`grpo_dist.config.spec.RunSpec` keeps the validated configuration."""


def _outside_config(pkg: Path):
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        if rel.parts[0] != "config":
            yield rel.as_posix(), ast.parse(path.read_text())


def config_readers(pkg: Path) -> dict[str, list[str]]:
    """``{module: [function names]}`` of the functions outside ``config/`` with a ``GRPOConfig`` (or ``cfg``) parameter."""
    out: dict[str, list[str]] = {}
    for module, tree in _outside_config(pkg):
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            if any(a.arg == "cfg" or (a.annotation is not None and "GRPOConfig" in ast.unparse(a.annotation))
                   for a in args):
                out.setdefault(module, []).append(node.name)
    return out


def private_reads(pkg: Path) -> dict[str, list[int]]:
    """``{module: [line numbers]}`` of the reads of the spec's private configuration (``x._cfg``, or
    ``getattr(x, "_cfg")``) outside ``config/``."""
    out: dict[str, list[int]] = {}
    for module, tree in _outside_config(pkg):
        for node in ast.walk(tree):
            direct = isinstance(node, ast.Attribute) and node.attr == PRIVATE
            dynamic = (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                       and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == PRIVATE)
            if direct or dynamic:
                out.setdefault(module, []).append(node.lineno)
    return {module: sorted(lines) for module, lines in out.items()}


def problems_of(pkg: Path) -> list[str]:
    problems = [f"{module}: {names} take the raw configuration; resolve what they need in config/ (the run "
                "specification, grpo_dist/config/spec.py) and pass that instead"
                for module, names in sorted(config_readers(pkg).items())]
    problems += [f"{module}: line(s) {lines} read the run specification's private configuration ({PRIVATE}); "
                 "give the spec a field or a method in config/ instead"
                 for module, lines in sorted(private_reads(pkg).items())]
    return problems


def test_no_raw_configuration_read_outside_config():
    problems = problems_of(PKG)
    assert problems == [], "\n".join(problems)


def test_the_check_finds_planted_readers(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "trainer").mkdir()
    (tmp_path / "config" / "x.py").write_text("def f(cfg: GRPOConfig): return cfg\ndef g(spec): return spec._cfg\n")
    (tmp_path / "trainer" / "a.py").write_text(textwrap.dedent("""
        def reads(cfg: GRPOConfig) -> int: return 1
        def takes_a_spec(spec: RunSpec) -> int: return spec.shape.world_size
        def unannotated(cfg): return 3
        class C:
            def m(self, *, cfg: "GRPOConfig"): pass
    """))
    (tmp_path / "trainer" / "b.py").write_text(textwrap.dedent("""
        def sneaks(spec):
            return spec._cfg.trainer.nnodes
        def dynamic(spec):
            return getattr(spec, "_cfg")
    """))
    assert config_readers(tmp_path) == {"trainer/a.py": ["reads", "unannotated", "m"]}
    assert private_reads(tmp_path) == {"trainer/b.py": [3, 5]}
    problems = problems_of(tmp_path)
    assert len(problems) == 2
    assert problems[0].startswith("trainer/a.py: ['reads', 'unannotated', 'm'] take the raw configuration")
    assert problems[1].startswith("trainer/b.py: line(s) [3, 5] read the run specification's private configuration")
    (tmp_path / "trainer" / "a.py").write_text("def takes_a_spec(spec): return spec.shape\n")
    (tmp_path / "trainer" / "b.py").write_text("def f(spec): return spec.launch.out_dir\n")
    assert problems_of(tmp_path) == []


if __name__ == "__main__":
    for line in problems_of(PKG) or ["nothing outside config/ reads the raw configuration"]:
        print(line)
