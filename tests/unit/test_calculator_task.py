"""The embedded agent task (grpo_dist/tasks/calculator.py): data, reward, tool, chat template, built-in names.

No model is trained here: the template tests build the task's tokenizer with an untrained tiny model
(well under a second)."""

from __future__ import annotations

import asyncio
import json

import pytest

from grpo_dist import tasks
from grpo_dist.data.rows import load_rows
from grpo_dist.rewards.scorers import DEFAULT_REGISTRY
from grpo_dist.tasks import calculator
from grpo_dist.tasks.calculator_tools import add
from grpo_dist.tools.calls import run_tool_call
from grpo_dist.tools.registry import load_tools
from grpo_dist.utils.tiny_model import SPECIAL_TOKENS, build_tiny_model


# ------------------------------------------------------------------------------------------ data
@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    paths = calculator.write_data(tmp_path_factory.mktemp("calc-data"))
    return {split: load_rows(str(path)) for split, path in paths.items()}


def _pair(row: dict) -> tuple[int, int]:
    word, a, b = row["prompt"][0]["content"].split()
    assert word == "add"
    return int(a), int(b)


def test_rows_are_valid_tool_agent_rows_with_the_sum_as_ground_truth(splits):
    assert len(splits["train"]) == calculator.N_TRAIN and len(splits["test"]) == calculator.N_TEST
    for split, rows in splits.items():
        for i, row in enumerate(rows):
            a, b = _pair(row)
            assert calculator.MIN_DIGITS <= len(str(a)) <= calculator.MAX_DIGITS
            assert calculator.MIN_DIGITS <= len(str(b)) <= calculator.MAX_DIGITS
            assert row["data_source"] == calculator.DATA_SOURCE
            assert row["reward_model"]["ground_truth"] == str(a + b)
            assert row["agent_name"] == "tool_agent"
            assert row["extra_info"] == {"split": split, "index": i, "tools_kwargs": {}}
            assert [m["role"] for m in row["prompt"]] == ["user"]


def test_no_test_pair_is_in_train_in_either_order(splits):
    train = {frozenset(_pair(r)) for r in splits["train"]}
    test = [frozenset(_pair(r)) for r in splits["test"]]
    assert len(set(test)) == len(test)
    assert not train & set(test)


def test_data_is_built_once_and_reused(tmp_path):
    first = calculator.ensure_data(tmp_path)
    stamp = first["train"].stat().st_mtime_ns
    again = calculator.ensure_data(tmp_path)
    assert again == first and again["train"].stat().st_mtime_ns == stamp
    assert first["test"].read_text() == (calculator.write_data(tmp_path / "again")["test"]).read_text()


# ---------------------------------------------------------------------------------------- reward
def trajectory(answer: str) -> str:
    """A tool trajectory decoded without special tokens, ending with ``answer``."""
    return ('<tool_call>\n{"name": "add", "arguments": {"a": 48213, "b": 90817}}\n</tool_call>\nuser\n'
            "<tool_response>\n139030\n</tool_response>\nassistant\n" + answer)


def test_score_is_one_for_exactly_the_sum_only():
    score = DEFAULT_REGISTRY.get(calculator.DATA_SOURCE)
    assert score(" 139030\n", "139030") == 1.0
    assert score("139031", "139030") == 0.0
    assert score("139030 is the sum", "139030") == 0.0
    assert score("", "139030") == 0.0


def test_score_reads_the_answer_after_the_tool_response():
    score = calculator.score
    assert score(trajectory("139030"), "139030") == 1.0
    assert score(trajectory("139031"), "139030") == 0.0
    # decoded with the special tokens kept
    kept = trajectory("139030<|im_end|>").replace("\nuser", "<|im_end|>\n<|im_start|>user").replace(
        "\nassistant", "<|im_end|>\n<|im_start|>assistant")
    assert score(kept, "139030") == 1.0
    # the tool's result alone is not an answer: the trajectory ended with a second call, or was cut
    assert score(trajectory(""), "139030") == 0.0
    assert score(trajectory('<tool_call>\n{"name": "add"}\n</tool_call>'), "139030") == 0.0


# ------------------------------------------------------------------------------------------ tool
def test_the_tool_file_holds_add_with_its_schema():
    tools = load_tools(function_tool_path=tasks.resolve("builtin:calculator/tools"))
    assert list(tools) == ["add"]
    schema = tools["add"].tool_schema.model_dump(exclude_none=True)["function"]
    assert schema["name"] == "add" and schema["description"] == "Add two integers."
    assert schema["parameters"]["required"] == ["a", "b"]
    assert {k: v["type"] for k, v in schema["parameters"]["properties"].items()} == {"a": "integer", "b": "integer"}


def test_the_tool_adds_and_bad_arguments_become_an_error_for_the_model():
    assert add(48213, 90817) == "139030"
    assert add("48213", " 90817 ") == "139030"
    tools = load_tools(function_tool_path=calculator.TOOLS_FILE)
    response, _, metrics = asyncio.run(run_tool_call(tools, "add", '{"a": 4821376, "b": 908172}'))
    assert response.text == "5729548" and metrics["tool_errors"] == 0.0
    for bad in ('{"a": "x", "b": 1}', '{"a": 1.5, "b": 1}', '{"a": 1}', '{"a": true, "b": 1}'):
        response, _, metrics = asyncio.run(run_tool_call(tools, "add", bad))
        assert metrics["tool_errors"] == 1.0, bad
        assert response.text.startswith("Error when executing tool"), bad


# -------------------------------------------------------------------------------------- template
@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("calc-tok")
    build_tiny_model(out, vocab=calculator.VOCAB, extra_tokens=calculator.EXTRA_TOKENS,
                     chat_template=calculator.CHAT_TEMPLATE)
    return AutoTokenizer.from_pretrained(out)


@pytest.fixture(scope="module")
def schemas():
    return calculator.tool_schemas()


def _call_message(a, b, content=""):
    return {"role": "assistant", "content": content,
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}]}


def test_tool_tags_are_single_tokens_kept_by_decoding(tok):
    for tag in calculator.EXTRA_TOKENS:
        ids = tok.encode(tag, add_special_tokens=False)
        assert len(ids) == 1 and tok.decode(ids, skip_special_tokens=True) == tag
    text = calculator.call_text(48213, 90817)
    assert tok.decode(tok.encode(text + "<|im_end|>", add_special_tokens=False), skip_special_tokens=True) == text
    assert len(tok) == len(SPECIAL_TOKENS) + len(calculator.VOCAB) + len(calculator.EXTRA_TOKENS)


def test_the_system_message_lists_the_tools_compactly(tok, schemas):
    prompt = tok.apply_chat_template(calculator.make_prompt(1, 2), tools=schemas, add_generation_prompt=True,
                                     tokenize=False)
    assert prompt == ("<|im_start|>system\n# Tools\nadd(a, b)<|im_end|>\n"
                      "<|im_start|>user\nadd 1 2<|im_end|>\n<|im_start|>assistant\n")
    with_system = tok.apply_chat_template([{"role": "system", "content": "Be exact."}] + calculator.make_prompt(1, 2),
                                          tools=schemas, tokenize=False)
    assert with_system.startswith("<|im_start|>system\nBe exact.\n# Tools\nadd(a, b)<|im_end|>\n")
    # without tools: plain ChatML, no system message unless given
    assert tok.apply_chat_template(calculator.make_prompt(1, 2), tokenize=False) == \
        "<|im_start|>user\nadd 1 2<|im_end|>\n"


@pytest.mark.parametrize("system", [None, "Use the tool."])
def test_a_tool_conversation_renders_as_an_agent_loop_builds_it(tok, schemas, system):
    a, b = 4821376, 908172
    total = str(a + b)
    head = [{"role": "system", "content": system}] if system else []
    prompt = head + calculator.make_prompt(a, b)
    messages = prompt + [_call_message(a, b), {"role": "tool", "content": total},
                         {"role": "assistant", "content": total}]
    one_shot = tok.apply_chat_template(messages, tools=schemas, tokenize=False)
    turn_by_turn = (tok.apply_chat_template(prompt, tools=schemas, add_generation_prompt=True, tokenize=False)
                    + calculator.call_text(a, b) + "<|im_end|>"  # the model's first turn, as sampled
                    + "\n<|im_start|>user\n<tool_response>\n" + total + "\n</tool_response><|im_end|>\n"
                    + "<|im_start|>assistant\n"  # the tool turn and the generation prompt
                    + total + "<|im_end|>" + "\n")
    assert one_shot == turn_by_turn
    assert tok.encode(one_shot, add_special_tokens=False) == tok.encode(turn_by_turn, add_special_tokens=False)
    # the call written by the model as text (no tool_calls field) renders the same
    as_text = messages[:-3] + [{"role": "assistant", "content": calculator.call_text(a, b)}] + messages[-2:]
    assert tok.apply_chat_template(as_text, tools=schemas, tokenize=False) == one_shot
    # the warm-start transcript is the same conversation, cut into trained and untrained pieces
    if system is None:
        pieces = calculator.transcript(tok, schemas, a, b)
        assert "".join(text for text, _ in pieces) == one_shot
        assert [text for text, trained in pieces if trained] == [calculator.call_text(a, b) + "<|im_end|>",
                                                                 total + "<|im_end|>"]


def test_the_tool_turn_renders_on_its_own(tok, schemas):
    tools_msgs = [{"role": "tool", "content": "12"}, {"role": "tool", "content": "34"}]
    block = "<|im_start|>user\n<tool_response>\n12\n</tool_response>\n<tool_response>\n34\n</tool_response><|im_end|>\n"
    # after a user and an assistant message, an earlier message renders the same whatever follows it
    anchor = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    base = tok.apply_chat_template(anchor, tools=schemas, tokenize=False)
    full = tok.apply_chat_template(anchor + tools_msgs, tools=schemas, add_generation_prompt=True, tokenize=False)
    assert full == base + block + "<|im_start|>assistant\n"
    # verl's way: the tool messages alone, less the rendering of [{}] (the template's prefix: nothing here)
    prefix = tok.apply_chat_template([{}], tokenize=False)
    alone = tok.apply_chat_template(tools_msgs, add_generation_prompt=True, tokenize=False)
    assert alone.startswith(prefix) and alone[len(prefix):] == block + "<|im_start|>assistant\n"


def test_tool_call_arguments_given_as_a_json_string_render_as_written(tok):
    message = {"role": "assistant", "content": "",
               "tool_calls": [{"function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}
    assert tok.apply_chat_template([message], tokenize=False) == (
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>\n')


def test_first_call_parses_what_the_tool_layer_can_run():
    assert calculator._first_call(calculator.call_text(1, 2)) == {"name": "add", "arguments": {"a": 1, "b": 2}}
    assert calculator._first_call("<tool_call>\n{not json}\n</tool_call>") is None
    assert calculator._first_call("3") is None
    assert json.loads(calculator.call_text(1, 2)[len("<tool_call>"):-len("</tool_call>")]) == \
        {"name": "add", "arguments": {"a": 1, "b": 2}}


# ---------------------------------------------------------------------------------- built-in names
def test_builtin_names_resolve(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_DIST_CACHE", str(tmp_path))
    assert tasks.resolve("builtin:calculator/train").endswith("calculator-data-v1/train.jsonl")
    assert load_rows(tasks.resolve("builtin:calculator/test"))[0]["agent_name"] == "tool_agent"
    assert tasks.resolve("builtin:calculator/tools") == str(calculator.TOOLS_FILE)
    built = []
    monkeypatch.setattr(calculator, "ensure_model", lambda cache: built.append(cache) or tmp_path / "m")
    assert tasks.resolve("builtin:tiny-calculator") == str(tmp_path / "m") and built == [str(tmp_path)]
    assert "tiny-calculator" in tasks.builtin_names("model")
    assert {"calculator/train", "calculator/test"} <= set(tasks.builtin_names("data"))
    assert tasks.builtin_names("tools") == ("calculator/tools",)
    with pytest.raises(ValueError, match="builtin:calculator/tools"):
        tasks.resolve("builtin:calculator/nope")


def test_tiny_model_extra_tokens_are_checked_and_default_to_none(tmp_path):
    from transformers import AutoTokenizer

    build_tiny_model(tmp_path / "plain", vocab=list("ab"))
    plain = AutoTokenizer.from_pretrained(tmp_path / "plain")
    assert len(plain) == len(SPECIAL_TOKENS) + 2
    assert plain.chat_template.startswith("{% for message in messages %}")
    for bad in (("x",), ("<t>", "<t>"), ("<|im_end|>",)):
        with pytest.raises(ValueError, match="extra_tokens"):
            build_tiny_model(tmp_path / "bad", vocab=list("ab"), extra_tokens=bad)


# ------------------------------------------------------------------------------------------ recipe
def test_the_recipe_names_the_builtin_task_tool_and_agent_loop():
    from grpo_dist.config.loader import compose, to_typed
    from grpo_dist.config.validate import validate_config

    cfg = compose([], config_name="recipes/agent_calculator_cpu")
    r = cfg.actor_rollout_ref.rollout
    assert cfg.actor_rollout_ref.model.path == "builtin:tiny-calculator"
    assert (cfg.data.train_files, cfg.data.val_files) == ("builtin:calculator/train", "builtin:calculator/test")
    assert r.mode == "async" and r.multi_turn.enable is True
    assert r.multi_turn.function_tool_path == "builtin:calculator/tools" and r.multi_turn.max_assistant_turns == 2
    validate_config(to_typed(cfg, []), check_paths=False)
