"""Generate ``conf/grpo_trainer.yaml``, ``docs/configuration.md`` and the README's list of refused
features from the schema.

    python -m grpo_dist.config.docgen          # rewrite them
    python -m grpo_dist.config.docgen --check  # exit 1 if any is out of date (used by the tests)

The schema dataclasses hold the defaults, help texts and key states; these files are views of them.
The README's list is the block between ``README_BEGIN`` and ``README_END``; the rest of the README is
written by hand. The refused features (:func:`refused_features`) feed both the reference's table and
that list, so the two cannot disagree.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any

from grpo_dist.config.loader import CONF_DIR, SCHEMA_NAME
from grpo_dist.config.fields import HONOURED, Honoured, NoOp, Refused
from grpo_dist.config.schema import INTERPOLATED_HELP, VERL_DEFAULT_DIFFERENCES, GRPOConfig
from grpo_dist.config.states import describe_state, leaf_states, state_of

ROOT = Path(__file__).resolve().parents[2]
YAML_PATH = CONF_DIR / "grpo_trainer.yaml"
DOC_PATH = ROOT / "docs" / "configuration.md"
README_PATH = ROOT / "README.md"
README_BEGIN = ("<!-- refused features: GENERATED from the key states by `python -m grpo_dist.config.docgen`; "
                "do not edit by hand -->")
README_END = "<!-- end of the generated refused features -->"


def _default(f: Any) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    raise AssertionError(f"field {f.name} has no default")


def _yaml_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_yaml_scalar(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_yaml_scalar(k)}: {_yaml_scalar(x)}" for k, x in v.items()) + "}"
    s = str(v)
    if any(not c.isprintable() for c in s):  # a newline, a tab: YAML's double-quoted form keeps the escapes
        import json

        return json.dumps(s)
    if s == "" or any(c in s for c in ":#{}[],&*?|<>=!%@`'\"") or s.strip() != s or _not_a_string_in_yaml(s):
        return "'" + s.replace("'", "''") + "'"
    return s


def _not_a_string_in_yaml(s: str) -> bool:
    """Text YAML would read as something else (a boolean, null or a number) unless quoted."""
    import yaml

    return not isinstance(yaml.safe_load(s), str)


def _help(f: Any, key: str) -> str:
    return f.metadata.get("help") or INTERPOLATED_HELP.get(key, "")


_RANK = {"honoured": 0, "no-op": 1, "refused": 2}


def _walk(cls: type, prefix: str = "", inherited: Any = None):
    """Yield ("section", key, help, depth) and ("leaf", key, (field, state), depth): within a section
    the honoured keys first, then those with no effect, then the refused ones (declaration order
    otherwise; a section ranks by its own state)."""
    items = []
    for f in fields(cls):
        own = f.metadata.get("state")
        state = own or inherited
        items.append((_RANK[(state or HONOURED).kind], f, state))
    for _rank, f, state in sorted(items, key=lambda t: t[0]):
        key = f"{prefix}{f.name}"
        depth = key.count(".")
        val = _default(f)
        if is_dataclass(val):
            yield "section", key, f.metadata.get("help", ""), depth
            yield from _walk(type(val), key + ".", state)
        else:
            yield "leaf", key, (f, state_of(key)), depth


def _tag(key: str, state: Any) -> str:
    short, _ = describe_state(key, state)
    return "" if short == "honoured" else f" [{short}]"


def render_yaml() -> str:
    lines = [
        "# grpo_dist trainer configuration: verl's key tree.",
        "# GENERATED from grpo_dist/config/schema/ by `python -m grpo_dist.config.docgen`; do not edit by hand.",
        "# Override any key on the command line, e.g.:",
        "#   python -m grpo_dist.main data.train_batch_size=64 actor_rollout_ref.rollout.n=8",
        "defaults:",
        f"  - {SCHEMA_NAME}",
        "  - _self_",
        "",
    ]
    for kind, key, payload, depth in _walk(GRPOConfig):
        ind = "  " * depth
        name = key.rsplit(".", 1)[-1]
        if kind == "section":
            if depth == 0:
                lines.append("")
            lines.append(f"{ind}{name}:  # {payload}")
        else:
            f, state = payload
            val = _default(f)
            lines.append(f"{ind}{name}: {_yaml_scalar(val)}  # {_help(f, key)}{_tag(key, state)}")
    return "\n".join(lines).rstrip() + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def refused_keys() -> list[tuple[str, str, str]]:
    """``(key, accepted, why and what to use instead)`` of every key with a value refused because the feature
    behind it is not built: refused keys, honoured keys' refused values, and no-op keys whose other values
    switch on an unbuilt feature (verl's Megatron backend, ...). Declaration order."""
    out = []
    for key, _f, state in leaf_states(GRPOConfig):
        short, why = describe_state(key, state)
        if isinstance(state, Refused):
            out.append((key, short, why))
        elif isinstance(state, Honoured):
            out += [(f"{key}={_yaml_scalar(bad)}", "any other value", instead) for bad, instead in state.refuse]
        elif isinstance(state, NoOp) and _NOT_BUILT.match(state.otherwise):
            out.append((key, short, state.otherwise))
    return out


_NOT_BUILT = re.compile(r"^(?P<feature>.+?) (?:is|are) not built(?: here)?(?:[;:,] *(?P<instead>.*))?$")
_SECTIONS = (  # the README's groups, by the first key of a feature
    ("data", ("data.",)),
    ("model and training", ("actor_rollout_ref.model.", "actor_rollout_ref.actor.", "actor_rollout_ref.ref.", "critic.",
                            "algorithm.")),
    ("rollout", ("actor_rollout_ref.",)),
    ("reward", ("reward_model.", "reward.", "reward_manager.", "sandbox_fusion.", "custom_reward_function.")),
    ("trainer, profiling and verl's other trainers", ("",)),
)


def refused_features() -> list[tuple[str, list[tuple[str, list[str], str]]]]:
    """The refused features, grouped for the README: ``[(group, [(feature, keys, what to use instead)])]``.
    A feature is the part of a refusal before "is not built" (keys sharing it are one feature); a refusal
    worded otherwise is its own feature, named by the key's help."""
    help_of = {key: _help(f, key) for key, f, _s in leaf_states(GRPOConfig)}
    features: dict[str, tuple[str, list[str], str]] = {}
    for key, _short, why in refused_keys():
        m = _NOT_BUILT.match(why)
        if m:
            feature, instead = m.group("feature"), (m.group("instead") or "").strip()
        else:
            feature, instead = help_of[key.split("=")[0]], why
        feature = feature[0].upper() + feature[1:]
        entry = features.setdefault(feature.lower(), (feature, [], instead))
        entry[1].append(key)
    groups: dict[str, list[tuple[str, list[str], str]]] = {name: [] for name, _ in _SECTIONS}
    for feature, keys, instead in features.values():
        group = next(name for name, prefixes in _SECTIONS if keys[0].startswith(prefixes))
        groups[group].append((feature, keys, instead))
    return [(name, items) for name, items in groups.items() if items]


def render_readme_block() -> str:
    """The README's list of refused features (between ``README_BEGIN`` and ``README_END``)."""
    lines = [README_BEGIN]
    for group, items in refused_features():
        lines.append(f"- {group}:")
        for feature, keys, instead in items:
            more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
            lines.append(f"  - {feature} (`{keys[0]}`{more})" + (f": {instead}" if instead else ""))
    lines.append(README_END)
    return "\n".join(lines)


def render_readme(current: str) -> str:
    """``current`` (the README's text) with its generated block replaced by :func:`render_readme_block`."""
    start, end = current.find(README_BEGIN), current.find(README_END)
    if start < 0 or end < start:
        raise SystemExit(f"{README_PATH}: the markers of the generated block are missing ({README_BEGIN!r} ... "
                         f"{README_END!r})")
    return current[:start] + render_readme_block() + current[end + len(README_END):]


def render_doc() -> str:
    out = [
        "# Configuration reference",
        "",
        "<!-- GENERATED from grpo_dist/config/schema/ by `python -m grpo_dist.config.docgen`; do not edit by hand. -->",
        "",
        "grpo_dist reads verl's key tree: every key of verl's trainer configuration (the early-2026 layout and the",
        "current one) is here, in one of three states:",
        "",
        "- **honoured**: it does what verl's does;",
        "- **no effect**: accepted, with no effect here, for the reason given; where only some values are no-ops,",
        "  they are listed and the others are refused;",
        "- **refused unless X**: the feature behind it is not built; the key is accepted at X (the feature off) and any",
        "  other value stops the run with one message naming the key, the value and what to use instead.",
        "",
        "Every key below can be overridden on the command line (`python -m grpo_dist.main key=value ...`, also",
        "`+key=value` and `++key=value`); `python -m grpo_dist.main --cfg job` prints the composed configuration.",
        "An unknown key, a value of the wrong type, a refused value or a combination that cannot work stops the run",
        "before any process starts, with a message naming the key. A run prints once, at start-up, every key given a",
        "value that has no effect here, and [the features refused](#features-refused-here) are listed at the end.",
        "The keys of verl's generated trainer configurations, FSDP and Megatron, are all below (the Megatron backend's",
        "settings with no effect, as `strategy=megatron` is refused); a key that is not listed (a misspelling, a key of",
        "another verl version) is refused as an unknown key, naming the nearest ones.",
        "",
    ]
    for kind, key, payload, depth in _walk(GRPOConfig):
        if kind == "section":
            out += ["", f"{'#' * min(depth + 2, 4)} `{key}`", "", payload, "",
                    "| key | default | state | meaning |", "| --- | --- | --- | --- |"]
        else:
            f, state = payload
            default = _yaml_scalar(_default(f)).replace("|", "\\|")
            short, why = describe_state(key, state)
            meaning = _help(f, key) + (f" ({why})" if why else "")
            out.append(f"| `{key}` | `{default}` | {_cell(short)} | {_cell(meaning)} |")
    out += [
        "",
        "## Features refused here",
        "",
        "The keys whose values switch on something grpo_dist does not build. Each is accepted at the value given,",
        "which leaves the feature off (the keys under such a feature have no effect while it is off). The README's",
        "list of refused features is generated from this table.",
        "",
        "| key | accepted | why, and what to use instead |",
        "| --- | --- | --- |",
    ]
    out += [f"| `{k}` | {_cell(short)} | {_cell(why)} |" for k, short, why in refused_keys()]
    out += [
        "",
        "## Defaults that differ from verl's",
        "",
        "The no-argument run is the embedded CPU job, so a few defaults differ from verl's",
        "`ppo_trainer.yaml`. A recipe that sets these keys explicitly trains the same way.",
        "",
        "| key | why |",
        "| --- | --- |",
    ]
    out += [f"| `{k}` | {v} |" for k, v in VERL_DEFAULT_DIFFERENCES.items()]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if the generated files are out of date")
    args = ap.parse_args(argv)
    stale = []
    readme = README_PATH.read_text()
    for path, text in ((YAML_PATH, render_yaml()), (DOC_PATH, render_doc()), (README_PATH, render_readme(readme))):
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date (run `python -m grpo_dist.config.docgen`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
