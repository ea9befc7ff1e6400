"""The package's layering: no module imports one above it, and there are no import cycles.

Layers, bottom to top (docs/architecture.md explains each):

    core                                   pure math (torch only)
    utils, batch, distributed              helpers, the batch container, process groups / Ray groups
    data, rewards, rollout, training, report   the library pieces
    tasks                                  embedded tasks and models (built from the pieces)
    config                                 the schema and its validation (reads names from below)
    workers                                thin Ray actor shells
    trainer, api                           the driver and the in-process API
    main                                   the command line

A module may import modules of its own layer or below, never above. Imports inside functions count
too: a lazy import still ties the lower module to the upper one.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "grpo_dist"

LAYERS = [
    {"core"},
    {"utils", "batch", "distributed"},
    {"data", "rewards", "rollout", "training", "report"},
    {"tasks"},
    {"config"},
    {"workers"},
    {"trainer", "api"},
    {"main"},
]
LAYER_OF = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """grpo_dist modules imported anywhere in the file (absolute and relative imports)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            if t.startswith("grpo_dist"):
                # the deepest known module the name refers to (from pkg import submodule -> the submodule)
                while t and t not in known:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                if t and t != name:
                    found.add(t)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(path, name, known) for name, path in mods.items()}


def layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None  # the package root may expose anything
    return LAYER_OF.get(parts[1])


def test_every_top_level_part_has_a_layer():
    parts = {m.split(".")[1] for m in modules() if "." in m}
    assert parts <= set(LAYER_OF), f"give these a layer in LAYERS: {sorted(parts - set(LAYER_OF))}"


def test_no_module_imports_a_higher_layer():
    bad = []
    for src, targets in graph().items():
        ls = layer(src)
        for dst in targets:
            ld = layer(dst)
            if ls is not None and ld is not None and ld > ls:
                bad.append(f"{src} (layer {ls}) imports {dst} (layer {ld})")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles():
    g = graph()
    # a package's __init__ importing its own submodules is how packages expose them, not a cycle
    edges = {m: {d for d in ds if not m or not d.startswith(m + ".")} for m, ds in g.items()}
    seen: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            if seen.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in seen:
                visit(d)
        stack.pop()
        seen[m] = 2

    for m in sorted(edges):
        if m not in seen:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The checks above are only as good as the import scan: it must find imports inside functions."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from grpo_dist.trainer import driver\n    import grpo_dist.core.kl\n")
    known = {"grpo_dist.trainer", "grpo_dist.trainer.driver", "grpo_dist.core", "grpo_dist.core.kl"}
    assert imports_of(f, "grpo_dist.core.x", known) == {"grpo_dist.trainer", "grpo_dist.trainer.driver",
                                                        "grpo_dist.core.kl"}
