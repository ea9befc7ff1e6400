"""The package's layering: no module imports one above it, there are no import cycles, and the heavy
third-party stacks are imported only where docs/architecture.md says.

Layers, bottom to top (docs/architecture.md explains each):

    core                                   pure math (torch only)
    utils, batch, distributed              helpers, the batch container, process groups / Ray groups
    data, rewards, rollout, tools, training, report   the library pieces
    tasks                                  embedded tasks and models (built from the pieces)
    config                                 the schema and its validation (reads names from below)
    workers                                thin Ray actor shells
    trainer, api                           the driver and the in-process API
    main                                   the command line

The package root (``grpo_dist/__init__.py``) only exposes the API (lazily): it sits in the API's
layer, so nothing below may import it.

A module may import modules of its own layer or below, never above. Imports inside functions count
too: a lazy import still ties the lower module to the upper one. ``from pkg import name`` depends on
``pkg/__init__.py`` when ``name`` is defined there, and only on the submodule when ``name`` is one
(Python imports a submodule it is asked for even from a package still being initialised), so a
package's ``__init__`` may re-export its submodules while a submodule that reads a name from its own
package's ``__init__`` closes a cycle.

Only ``rollout/`` imports vLLM. Only ``distributed/`` and ``workers/`` import Ray at module level, and
the trainer never imports it (it reaches Ray through ``distributed/``).

``trainer/driver.py`` reads top to bottom as the step recipe: it holds the driver class and nothing else, each
timed phase of the step delegates to one or two calls, no method grows into a protocol of its own, and a
generous size guard catches a file that has stopped being a recipe.

Each check is a function of a package folder (or file), so the tests at the end plant violations in a small
synthetic package and watch the check fail.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "grpo_dist"
ROOT = "grpo_dist"

LAYERS = [
    {"core"},
    {"utils", "batch", "distributed"},
    {"data", "rewards", "rollout", "tools", "agents", "training", "report"},
    {"tasks"},
    {"config"},
    {"workers"},
    {"trainer", "api"},
    {"main"},
]
LAYER_OF = {part: i for i, layer in enumerate(LAYERS) for part in layer}
ROOT_LAYER = LAYER_OF["api"]  # the root package re-exports the API and nothing else

VLLM_ALLOWED = ("rollout",)
RAY_MODULE_LEVEL_ALLOWED = ("distributed", "workers")
RAY_FORBIDDEN = ("trainer",)  # not even lazily: the trainer reaches Ray through distributed/


def modules(pkg: Path = PKG) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package in ``pkg`` (a package's
    ``__init__.py`` is named by the package)."""
    out = {}
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _deepest_known(name: str, known: set[str]) -> str:
    while name and name not in known:
        name = name.rsplit(".", 1)[0] if "." in name else ""
    return name


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """Package modules that the file depends on, imports inside functions included.

    ``import a.b.c`` and ``from a.b import c`` (``c`` a submodule) depend on that module;
    ``from a.b import x`` (``x`` defined in ``a/b/__init__.py``) depends on the package ``a.b``.
    """
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
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in known else base)
        for t in targets:
            if t == ROOT or t.startswith(ROOT + "."):
                t = _deepest_known(t, known)
                if t and t != name:
                    found.add(t)
    return found


def graph(pkg: Path = PKG) -> dict[str, set[str]]:
    mods = modules(pkg)
    known = set(mods)
    return {name: imports_of(path, name, known) for name, path in mods.items()}


def layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return ROOT_LAYER
    return LAYER_OF.get(parts[1])


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in g.items():
        ls = layer(src)
        for dst in targets:
            ld = layer(dst)
            if ls is not None and ld is not None and ld > ls:
                bad.append(f"{src} (layer {ls}) imports {dst} (layer {ld})")
    return sorted(bad)


def import_cycles(g: dict[str, set[str]]) -> list[str]:
    seen: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if seen.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in seen:
                visit(d)
        stack.pop()
        seen[m] = 2

    for m in sorted(g):
        if m not in seen:
            visit(m)
    return cycles


def third_party_imports(path: Path, top: str) -> list[tuple[int, bool]]:
    """``(line, at_module_level)`` of every import of the distribution ``top`` (``import top``,
    ``import top.x``, ``from top.x import y``) in the file; inside a function it is not at module level."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def walk(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and not child.level and child.module:
                names = [child.module]
            if any(n == top or n.startswith(top + ".") for n in names):
                found.append((child.lineno, module_level))
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            walk(child, module_level and not nested)

    walk(tree, True)
    return found


def _part(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def misplaced_vllm(pkg: Path = PKG) -> list[str]:
    return sorted(
        f"{name}:{line} imports vllm (only {', '.join(p + '/' for p in VLLM_ALLOWED)} may)"
        for name, path in modules(pkg).items()
        for line, _ in third_party_imports(path, "vllm")
        if _part(name) not in VLLM_ALLOWED
    )


def misplaced_ray(pkg: Path = PKG) -> list[str]:
    bad = []
    for name, path in modules(pkg).items():
        for line, module_level in third_party_imports(path, "ray"):
            if _part(name) in RAY_FORBIDDEN:
                bad.append(f"{name}:{line} imports ray: the trainer reaches Ray through grpo_dist.distributed")
            elif module_level and _part(name) not in RAY_MODULE_LEVEL_ALLOWED:
                bad.append(f"{name}:{line} imports ray at module level (only "
                           f"{', '.join(p + '/' for p in RAY_MODULE_LEVEL_ALLOWED)} may; import it inside the function)")
    return sorted(bad)


# ---------------------------------------------------------------------------------------------
# the package
# ---------------------------------------------------------------------------------------------
def test_every_top_level_part_has_a_layer():
    parts = {m.split(".")[1] for m in modules() if "." in m}
    assert parts <= set(LAYER_OF), f"give these a layer in LAYERS: {sorted(parts - set(LAYER_OF))}"


def test_no_module_imports_a_higher_layer():
    bad = upward_imports(graph())
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    cycles = import_cycles(graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_only_rollout_imports_vllm():
    bad = misplaced_vllm()
    assert not bad, "\n".join(bad)


def test_only_distributed_and_workers_import_ray_at_module_level_and_the_trainer_never():
    bad = misplaced_ray()
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------------------------
# the checks themselves, on planted violations
# ---------------------------------------------------------------------------------------------
def fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package named like ours under ``tmp_path`` with the given files (relative paths -> source);
    every folder gets an ``__init__.py`` unless one is given."""
    pkg = tmp_path / ROOT
    for rel, src in {"__init__.py": "", **files}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(src))
    for folder in [pkg, *(p for p in pkg.rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    return pkg


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The checks above are only as good as the import scan: it must find imports inside functions."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from grpo_dist.trainer import driver\n    import grpo_dist.core.kl\n"
                 "from . import losses\nfrom .kl import kl_penalty\n")
    known = {"grpo_dist.trainer", "grpo_dist.trainer.driver", "grpo_dist.core", "grpo_dist.core.kl", "grpo_dist.core.losses"}
    assert imports_of(f, "grpo_dist.core.x", known) == {"grpo_dist.trainer.driver", "grpo_dist.core.kl",
                                                        "grpo_dist.core.losses"}


ROLLOUT_INIT = """
    from grpo_dist.rollout.base import Engine
    ENGINES = {"x": Engine}
"""


@pytest.mark.parametrize(
    ("base_py", "cycle"),
    [
        ("from grpo_dist.rollout import ENGINES\nclass Engine: ...\n", True),  # reads a name from its package
        ("def names():\n    from grpo_dist.rollout import ENGINES\n    return ENGINES\nclass Engine: ...\n", True),
        ("from . import ENGINES\nclass Engine: ...\n", True),
        ("from grpo_dist.rollout import util\nclass Engine: ...\n", False),  # a sibling submodule: fine
        ("class Engine: ...\n", False),
    ],
)
def test_a_submodule_importing_its_own_package_is_a_cycle_but_reexporting_is_not(tmp_path, base_py, cycle):
    pkg = fake_package(tmp_path, {"rollout/__init__.py": ROLLOUT_INIT, "rollout/base.py": base_py,
                                  "rollout/util.py": "X = 1\n"})
    found = import_cycles(graph(pkg))
    assert bool(found) == cycle, found
    if cycle:
        assert found == ["grpo_dist.rollout -> grpo_dist.rollout.base -> grpo_dist.rollout"]


ROOT_INIT = """
    def __getattr__(name):
        from grpo_dist import api
        return getattr(api, name)
"""


def test_the_root_package_may_expose_the_api_but_lower_layers_may_not_import_it(tmp_path):
    files = {"__init__.py": ROOT_INIT, "api.py": "from grpo_dist.core import kl\n", "core/kl.py": "X = 1\n",
             "main.py": "from grpo_dist import GRPO\n", "trainer/run.py": "from grpo_dist import tasks\n",
             "tasks/__init__.py": "Y = 2\n"}
    pkg = fake_package(tmp_path, files)
    assert upward_imports(graph(pkg)) == []  # root -> api (same layer); main -> root; trainer -> tasks (a submodule)
    assert import_cycles(graph(pkg)) == []
    pkg = fake_package(tmp_path, files | {"core/kl.py": "def f():\n    from grpo_dist import GRPO\n"})
    assert upward_imports(graph(pkg)) == [f"grpo_dist.core.kl (layer 0) imports grpo_dist (layer {ROOT_LAYER})"]


def test_vllm_outside_rollout_is_found_even_inside_a_function(tmp_path):
    pkg = fake_package(tmp_path, {"rollout/vllm_engine.py": "def load():\n    from vllm import LLM\n",
                                  "training/x.py": "import os\n"})
    assert misplaced_vllm(pkg) == []
    pkg = fake_package(tmp_path, {"training/x.py": "def f():\n    import vllm.inputs\n"})
    assert misplaced_vllm(pkg) == ["grpo_dist.training.x:2 imports vllm (only rollout/ may)"]


@pytest.mark.parametrize(
    ("rel", "src", "bad"),
    [
        ("workers/actor.py", "import ray\n", None),
        ("distributed/group.py", "from ray.util.placement_group import placement_group\n", None),
        ("main.py", "def shutdown():\n    import ray\n", None),  # lazily, outside the trainer: allowed
        ("rewards/pool.py", "import ray\n", "grpo_dist.rewards.pool:1 imports ray at module level"),
        ("rewards/pool.py", "try:\n    import ray\nexcept ImportError:\n    ray = None\n",
         "grpo_dist.rewards.pool:2 imports ray at module level"),
        ("main.py", "class C:\n    from ray import get\n", "grpo_dist.main:2 imports ray at module level"),
        ("trainer/driver.py", "def f():\n    import ray\n", "grpo_dist.trainer.driver:2 imports ray: the trainer"),
        ("trainer/driver.py", "import ray.util\n", "grpo_dist.trainer.driver:1 imports ray: the trainer"),
    ],
)
def test_ray_outside_distributed_and_workers_is_found(tmp_path, rel, src, bad):
    found = misplaced_ray(fake_package(tmp_path, {rel: src, "rewards/other.py": "import rayleigh\n"}))
    if bad is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(bad), found


# ---------------------------------------------------------------------------------------------
# the driver reads as the step recipe
# ---------------------------------------------------------------------------------------------
PHASE_MAX_STATEMENTS = 2
"""A timed phase of the step (``with timer("<phase>"):``) delegates: one or two calls, no logic of its own."""
METHOD_MAX_LINES = 80
"""A driver method longer than this has become a protocol of its own (like the weight sync, dynamic sampling)."""
DRIVER_GUARD_LINES = 600
"""Not a budget to code around: far above today's size, it only catches a driver that is no longer a recipe."""
WHERE_TO_MOVE = (
    "keep it the step recipe and move the rest out: a protocol with several steps becomes its own object "
    "(like trainer/weight_sync.py, trainer/dynamic_sampling.py), settings and values derived from the config go "
    "to the run plan (config/driver_plan.py), role wiring to trainer/roles.py, sharded worker calls to trainer/updates.py, "
    "rollout output -> batch to rollout/assemble.py, metrics to trainer/metrics.py"
)


def _is_timed_phase(node: ast.AST) -> str | None:
    """The phase name of ``with timer("<name>"):`` (any name bound to a Timer is called ``timer`` here)."""
    if not isinstance(node, ast.With) or len(node.items) != 1:
        return None
    call = node.items[0].context_expr
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "timer" and call.args
            and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
        return call.args[0].value
    return None


def recipe_problems(path: Path) -> list[str]:
    """What keeps ``path`` (the driver module) from reading as the step recipe; empty when nothing does."""
    text = path.read_text()
    tree = ast.parse(text)
    out = []
    lines = len(text.splitlines())
    if lines >= DRIVER_GUARD_LINES:
        out.append(f"{path.name} has {lines} lines (guard: {DRIVER_GUARD_LINES})")
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    extra = [n.name for n in defs if not isinstance(n, ast.ClassDef)] + [n.name for n in defs if isinstance(n, ast.ClassDef)][1:]
    if extra:
        out.append(f"{path.name} defines {extra} beside the driver class")
    for cls in (n for n in defs if isinstance(n, ast.ClassDef)):
        for fn in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            length = fn.end_lineno - fn.lineno + 1
            if length > METHOD_MAX_LINES:
                out.append(f"{cls.name}.{fn.name} has {length} lines (at most {METHOD_MAX_LINES})")
            for node in ast.walk(fn):
                phase = _is_timed_phase(node)
                encloses = phase is not None and any(_is_timed_phase(n) for b in node.body for n in ast.walk(b))
                if phase is not None and not encloses and len(node.body) > PHASE_MAX_STATEMENTS:
                    out.append(f"{cls.name}.{fn.name}: phase {phase!r} has {len(node.body)} statements "
                               f"(at most {PHASE_MAX_STATEMENTS}: delegate it to one call)")
    return out


def test_the_driver_reads_as_the_step_recipe():
    problems = recipe_problems(PKG / "trainer" / "driver.py")
    assert problems == [], "; ".join(problems) + ": " + WHERE_TO_MOVE


def test_the_recipe_check_finds_logic_in_a_phase_a_helper_beside_the_class_and_a_long_method(tmp_path):
    f = tmp_path / "driver.py"
    good = textwrap.dedent("""
        class Driver:
            def step(self, batch):
                with timer("adv"):
                    self.rewards(batch)
                    self.advantages(batch)
                return batch
    """)
    f.write_text(good)
    assert recipe_problems(f) == []
    f.write_text(good.replace("        return batch", "        with timer(\"update\"):\n            a = 1\n"
                                                       "            b = 2\n            c = a + b\n        return batch"))
    assert recipe_problems(f) == ["Driver.step: phase 'update' has 3 statements (at most 2: delegate it to one call)"]
    f.write_text(textwrap.dedent("""
        class Driver:
            def step(self, batch):
                with timer("step"):
                    a = self.generate(batch)
                    b = self.score(a)
                    with timer("adv"):
                        self.advantages(b)
    """))
    assert recipe_problems(f) == []  # a phase that holds the others is the recipe itself
    f.write_text(good + "\ndef helper():\n    pass\n")
    assert recipe_problems(f) == ["driver.py defines ['helper'] beside the driver class"]
    long_method = "        x = 1\n" * METHOD_MAX_LINES
    f.write_text(good.replace("        return batch", long_method + "        return batch"))
    assert recipe_problems(f) == [f"Driver.step has {METHOD_MAX_LINES + 5} lines (at most {METHOD_MAX_LINES})"]
    f.write_text("x = 1\n" * DRIVER_GUARD_LINES)
    assert recipe_problems(f) == [f"driver.py has {DRIVER_GUARD_LINES} lines (guard: {DRIVER_GUARD_LINES})"]
