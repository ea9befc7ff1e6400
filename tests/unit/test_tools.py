"""The tool layer (grpo_dist/tools/): schemas in verl's form, @function_tool schemas from type hints and
docstrings, verl's tool config YAML and tool files loaded with only the module name changed, one clear
message for a bad config, the built-in tools, and every fault of a tool call turned into text for the model."""

from __future__ import annotations

import asyncio
import json
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from grpo_dist.tools.base_tool import BaseTool
from grpo_dist.tools.calls import ERROR_PREFIX, run_tool_call, truncate_text
from grpo_dist.tools.function_tool import FunctionTool, FunctionToolError, function_tool, load_function_tools
from grpo_dist.tools.gsm8k_tool import Gsm8kTool
from grpo_dist.tools.registry import ToolConfigError, load_tool_config, load_tools, resolve_class_name
from grpo_dist.tools.sandbox_fusion_tools import SandboxFusionTool, run_code_endpoint
from grpo_dist.tools.schemas import (OpenAIFunctionCallSchema, OpenAIFunctionParsedSchema,
                                     OpenAIFunctionToolSchema, ToolResponse)


def call(tools, name, args, **kw):
    kw.setdefault("timeout_s", 5.0)
    return asyncio.run(run_tool_call(tools, name, args if isinstance(args, str) else json.dumps(args), **kw))


# ---------------------------------------------------------------------------------------------
# schemas
# ---------------------------------------------------------------------------------------------
GSM8K_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calc_gsm8k_reward",
        "description": "A tool for calculating the reward of gsm8k.",
        "parameters": {"type": "object",
                       "properties": {"answer": {"type": "string", "description": "The model's answer"}},
                       "required": ["answer"]},
    },
}


def test_the_schema_parses_verls_dict_form_and_dumps_it_back():
    schema = OpenAIFunctionToolSchema.model_validate(GSM8K_SCHEMA)
    assert schema.function.name == "calc_gsm8k_reward"
    assert schema.function.parameters.properties["answer"].description == "The model's answer"
    assert schema.function.parameters.required == ["answer"]
    assert schema.model_dump(exclude_unset=True) == GSM8K_SCHEMA
    assert ToolResponse().is_empty() and ToolResponse(text="x").text == "x"
    assert set(ToolResponse.model_fields) == {"text", "image", "video"}


def test_a_parsed_call_with_bad_json_decodes_to_empty_arguments_and_a_flag():
    good, bad = (OpenAIFunctionCallSchema.from_openai_function_parsed_schema(OpenAIFunctionParsedSchema(name="f", arguments=a))
                 for a in ('{"x": 1}', '{"x": '))
    assert good == (OpenAIFunctionCallSchema(name="f", arguments={"x": 1}), False)
    assert bad == (OpenAIFunctionCallSchema(name="f", arguments={}), True)


# ---------------------------------------------------------------------------------------------
# @function_tool
# ---------------------------------------------------------------------------------------------
@function_tool
def multiply(a: int, b: float, round_to: int | None = None) -> str:
    """Multiply two numbers.

    Args:
        a: the first factor
        b: the second factor,
            possibly a fraction
        round_to: digits to round the product to
    """
    product = a * b
    return str(round(product, round_to) if round_to is not None else product)


@function_tool(name="lookup")
async def find_word(word: str, tags: list[str] = ()) -> dict:
    """Look a word up.

    Args:
        word: the word
        tags: labels to filter by
    """
    return {"word": word, "tags": list(tags)}


def test_the_schema_comes_from_type_hints_and_the_google_docstring():
    fn = FunctionTool(multiply).tool_schema.function
    assert fn.name == "multiply" and fn.description == "Multiply two numbers."
    props = fn.parameters.properties
    assert {k: p.type for k, p in props.items()} == {"a": "integer", "b": "number", "round_to": "integer"}
    assert props["a"].description == "the first factor"
    assert props["b"].description == "the second factor, possibly a fraction"
    assert fn.parameters.required == ["a", "b"]  # the parameters without defaults
    lookup = FunctionTool(find_word).tool_schema.function
    assert lookup.name == "lookup" and lookup.parameters.required == ["word"]
    assert lookup.parameters.properties["tags"].model_dump()["items"] == {"type": "string"}
    assert multiply(2, 3) == "6"  # the decorated function still works as a function


def test_a_function_without_a_description_for_a_parameter_is_refused_naming_it():
    def undocumented(a: int, b: int) -> int:
        """Add.

        Args:
            a: the first
        """

    with pytest.raises(FunctionToolError, match="undocumented.*'b'"):
        function_tool(undocumented)


def test_sync_and_async_function_tools_run_through_a_call():
    tools = {t.name: t for t in (FunctionTool(multiply), FunctionTool(find_word))}
    response, reward, metrics = call(tools, "multiply", {"a": 3, "b": 1.5})
    assert (response.text, reward, metrics["tool_errors"]) == ("4.5", 0.0, 0.0)
    response, _, _ = call(tools, "lookup", {"word": "cat", "tags": ["noun"]})
    assert json.loads(response.text) == {"word": "cat", "tags": ["noun"]}


# A verl-style function-tool file; it moves over with the module name changed.
FUNCTION_TOOL_FILE = '''
import asyncio
from verl.tools.function_tool import function_tool


@function_tool
def add(a: int, b: int = 0) -> str:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return str(a + b)


@function_tool
async def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: what to shout
    """
    await asyncio.sleep(0)
    return text.upper()


def helper(x):
    return x
'''


def test_a_function_tool_file_gives_every_decorated_function_in_order(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text(FUNCTION_TOOL_FILE.replace("verl.tools.", "grpo_dist.tools."))
    tools = load_function_tools(path)
    assert [t.name for t in tools] == ["add", "shout"]
    by_name = {t.name: t for t in tools}
    assert call(by_name, "add", {"a": 2, "b": 5})[0].text == "7"
    assert call(by_name, "shout", {"text": "hi"})[0].text == "HI"


@pytest.mark.parametrize(("text", "expect"), [
    (None, "no such file"),
    ("def broken(:\n", "importing it failed (line 1): SyntaxError"),
    ("import not_a_module_anywhere\n", "ModuleNotFoundError"),
    ("def f(x):\n    return x\n", "no function decorated with @function_tool"),
    ("from grpo_dist.tools.function_tool import function_tool\n@function_tool\ndef f(x):\n    '''F.'''\n",
     "function tool 'f'"),
])
def test_a_bad_function_tool_file_gives_one_message_naming_it(tmp_path, text, expect):
    path = tmp_path / "tools_file.py"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ToolConfigError) as err:
        load_tools(function_tool_path=path)
    message = str(err.value)
    assert str(path) in message and expect in message and "\n" not in message


# ---------------------------------------------------------------------------------------------
# verl's tool config YAML and tool classes
# ---------------------------------------------------------------------------------------------
# A user's verl tool file (BaseTool subclass), as written for verl; only the module name changes.
VERL_TOOL_FILE = '''
from typing import Any, Optional
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


class CounterTool(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        self._instance_dict = {}
        self.step = config.get("step", 1)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    async def create(self, instance_id: Optional[str] = None, start: int = 0, **kwargs) -> tuple[str, ToolResponse]:
        if instance_id is None:
            instance_id = str(uuid4())
        self._instance_dict[instance_id] = {"count": start}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        times = parameters.get("times", 1)
        self._instance_dict[instance_id]["count"] += self.step * times
        count = self._instance_dict[instance_id]["count"]
        return ToolResponse(text=f"count={count}"), 0.5, {"count": count}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return float(self._instance_dict[instance_id]["count"])

    async def release(self, instance_id: str, **kwargs) -> None:
        del self._instance_dict[instance_id]


class NotATool:
    def __init__(self, config, tool_schema):
        pass
'''

TOOL_CONFIG = """
tools:
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool
    config:
      type: native
    tool_schema:
      type: function
      function:
        name: calc_gsm8k_reward
        description: A tool for calculating the reward of gsm8k
        parameters:
          type: object
          properties:
            answer:
              type: string
              description: The model's answer to the GSM8K math problem, must be a digits
          required: ["answer"]
  - class_name: my_verl_tools.CounterTool
    config:
      type: native
      step: 3
    tool_schema:
      type: function
      function:
        name: counter
        description: Count up.
        parameters:
          type: object
          properties:
            times: {type: integer, description: how many steps}
          required: []
"""


@pytest.fixture
def tool_module(tmp_path, monkeypatch):
    (tmp_path / "my_verl_tools.py").write_text(VERL_TOOL_FILE.replace("verl.tools.", "grpo_dist.tools."))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_verl_tools"
    import sys

    sys.modules.pop("my_verl_tools", None)


def test_verls_module_prefix_reads_as_ours():
    assert resolve_class_name("verl.tools.gsm8k_tool.Gsm8kTool") == "grpo_dist.tools.gsm8k_tool.Gsm8kTool"
    assert resolve_class_name("verl.tools.sandbox_fusion_tools.SandboxFusionTool") == \
        "grpo_dist.tools.sandbox_fusion_tools.SandboxFusionTool"
    assert resolve_class_name("my.pkg.Tool") == "my.pkg.Tool"


def test_a_verl_tool_config_and_tool_file_load_with_only_the_module_name_changed(tmp_path, tool_module):
    path = tmp_path / "tool_config.yaml"
    path.write_text(TOOL_CONFIG)
    tools = load_tools(tool_config_path=path)
    assert list(tools) == ["calc_gsm8k_reward", "counter"]
    assert isinstance(tools["calc_gsm8k_reward"], Gsm8kTool)
    counter = tools["counter"]
    assert isinstance(counter, BaseTool) and counter.config == {"type": "native", "step": 3}
    response, reward, metrics = call(tools, "counter", {"times": 2}, tools_kwargs={"counter": {"create_kwargs": {"start": 10}}})
    assert (response.text, reward, metrics["tool/counter/count"]) == ("count=16", 0.5, 16.0)


def test_the_tool_config_and_function_tools_load_together_and_a_name_twice_is_refused(tmp_path, tool_module):
    config = tmp_path / "tool_config.yaml"
    config.write_text(TOOL_CONFIG)
    functions = tmp_path / "fns.py"
    functions.write_text(FUNCTION_TOOL_FILE.replace("verl.tools.", "grpo_dist.tools."))
    assert list(load_tools(config, functions)) == ["calc_gsm8k_reward", "counter", "add", "shout"]
    functions.write_text(FUNCTION_TOOL_FILE.replace("verl.tools.", "grpo_dist.tools.").replace("def add", "def counter"))
    with pytest.raises(ToolConfigError, match="tool name 'counter' is defined twice"):
        load_tools(config, functions)


ENTRY = "  - class_name: {cls}\n    config: {{type: {type}}}\n    tool_schema: {schema}\n"
GOOD_SCHEMA = '{type: function, function: {name: t, description: d, parameters: {type: object, properties: {}, required: []}}}'


@pytest.mark.parametrize(("text", "expect"), [
    ("tools: 3\n", "expected a top-level 'tools:' list"),
    ("tools:\n  - config: {type: native}\n", "tools[0]: missing class_name"),
    ("tools:\n" + ENTRY.format(cls="no_such_module_x.Tool", type="native", schema=GOOD_SCHEMA),
     "tools[0] (no_such_module_x.Tool): module 'no_such_module_x' not found"),
    ("tools:\n" + ENTRY.format(cls="my_verl_tools.Missing", type="native", schema=GOOD_SCHEMA),
     "tools[0] (my_verl_tools.Missing): module 'my_verl_tools' has no class 'Missing'"),
    ("tools:\n" + ENTRY.format(cls="my_verl_tools.NotATool", type="native", schema=GOOD_SCHEMA),
     "tools[0] (my_verl_tools.NotATool): my_verl_tools.NotATool is not a BaseTool subclass"),
    ("tools:\n" + ENTRY.format(cls="my_verl_tools.CounterTool", type="native",
                              schema="{type: function, function: {description: no name}}"),
     "tools[0] (my_verl_tools.CounterTool): bad tool_schema: function.name: Field required"),
    ("tools:\n" + ENTRY.format(cls="my_verl_tools.CounterTool", type="mcp", schema=GOOD_SCHEMA),
     "config.type 'mcp' is not supported"),
    ("tools:\n" + ENTRY.format(cls="my_verl_tools.CounterTool", type="native", schema=GOOD_SCHEMA)
     + ENTRY.format(cls="verl.tools.gsm8k_tool.Nope", type="native", schema=GOOD_SCHEMA),
     "tools[1] (verl.tools.gsm8k_tool.Nope): module 'grpo_dist.tools.gsm8k_tool' has no class 'Nope'"),
    ("tools:\n  - class_name: my_verl_tools.CounterTool\n    config: {type: native}\n",
     "tools[0] (my_verl_tools.CounterTool): creating the tool failed"),
    ("tools: [\n", "not valid YAML"),
])
def test_a_bad_tool_config_gives_one_message_naming_the_file_the_entry_and_the_problem(tmp_path, tool_module, text, expect):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ToolConfigError) as err:
        load_tool_config(path)
    message = str(err.value)
    assert message.startswith(f"tool config {path}: ") and expect in message, message
    assert err.value.__cause__ is None  # no chained traceback wall
    assert err.value.__context__ is None or err.value.__suppress_context__
    assert "Traceback" not in message


def test_a_missing_tool_config_file_is_named(tmp_path):
    with pytest.raises(ToolConfigError, match=f"tool config {tmp_path / 'nope.yaml'}: no such file"):
        load_tools(tool_config_path=tmp_path / "nope.yaml")


# ---------------------------------------------------------------------------------------------
# faults of a call: text for the model, counted, never raised
# ---------------------------------------------------------------------------------------------
class FaultyTool(BaseTool):
    def __init__(self, name: str, behaviour):
        super().__init__({"type": "native"}, OpenAIFunctionToolSchema.model_validate(
            {"type": "function", "function": {"name": name, "description": "x"}}))
        self.behaviour = behaviour
        self.released = []

    async def execute(self, instance_id, parameters, **kwargs):
        return await self.behaviour(parameters)

    async def release(self, instance_id, **kwargs):
        self.released.append(instance_id)


async def _raise(parameters):
    raise ZeroDivisionError("division by zero")


async def _hang(parameters):
    await asyncio.sleep(60)


async def _big(parameters):
    return ToolResponse(text="a" * 50 + "b" * 50), 0.25, {"size": 100}


async def _echo(parameters):
    return ToolResponse(text=json.dumps(parameters)), 0.0, {}


@pytest.fixture
def faulty():
    return {n: FaultyTool(n, b) for n, b in (("raises", _raise), ("hangs", _hang), ("big", _big), ("echo", _echo))}


def _assert_error(result, kind, *text):
    response, reward, metrics = result
    assert response.text.startswith(ERROR_PREFIX), response.text
    assert all(t in response.text for t in text), response.text
    assert reward == 0.0 and metrics["tool_calls"] == 1.0 and metrics["tool_errors"] == 1.0
    assert metrics[f"tool_errors/{kind}"] == 1.0
    assert sum(v for k, v in metrics.items() if k.startswith("tool_errors/")) == 1.0


def test_a_tool_that_raises_gives_an_error_text_and_is_released(faulty):
    _assert_error(call(faulty, "raises", {}), "exception", "'raises'", "ZeroDivisionError: division by zero")
    assert len(faulty["raises"].released) == 1


def test_a_tool_that_hangs_is_cut_at_its_timeout(faulty):
    result = call(faulty, "hangs", {}, timeout_s=0.2)
    _assert_error(result, "timeout", "'hangs' did not finish within 0.2 s")
    assert result[2]["tool_wall_s"] < 2
    assert len(faulty["hangs"].released) == 1


def test_an_unknown_tool_name_names_the_available_ones(faulty):
    _assert_error(call(faulty, "nope", {}), "unknown_tool", "no tool named 'nope'", "available: big, echo, hangs, raises")


@pytest.mark.parametrize("arguments", ['{"x": 1', "[1, 2]", "not json"])
def test_arguments_that_are_not_a_json_object_give_an_error_text(faulty, arguments):
    _assert_error(call(faulty, "echo", arguments), "invalid_arguments", "invalid arguments for 'echo'")


def test_valid_arguments_reach_the_tool_and_a_clean_call_counts_no_error(faulty):
    response, _, metrics = call(faulty, "echo", '{"x": [1, 2]}')
    assert json.loads(response.text) == {"x": [1, 2]}
    assert metrics["tool_errors"] == 0.0 and metrics["tool_truncated"] == 0.0


@pytest.mark.parametrize(("side", "expect"), [
    ("left", "a" * 10 + "...(truncated)"),
    ("right", "(truncated)..." + "b" * 10),
    ("middle", "a" * 5 + "...(truncated)..." + "b" * 5),
])
def test_an_oversized_response_is_cut_as_verl_cuts_it_and_counted(faulty, side, expect):
    response, reward, metrics = call(faulty, "big", {}, max_chars=10, truncate_side=side)
    assert response.text == expect
    assert reward == 0.25 and metrics["tool_truncated"] == 1.0 and metrics["tool_errors"] == 0.0
    assert metrics["tool/big/size"] == 100.0
    assert truncate_text("short", 10, side) == "short"


def test_many_faulty_calls_at_once_all_come_back(faulty):
    async def batch():
        names = ["raises", "hangs", "big", "echo", "nope"] * 4
        return await asyncio.gather(*(run_tool_call(faulty, n, "{}", timeout_s=0.2, max_chars=20) for n in names))

    results = asyncio.run(batch())
    assert len(results) == 20 and sum(m["tool_errors"] for _, _, m in results) == 12


# ---------------------------------------------------------------------------------------------
# built-in tools
# ---------------------------------------------------------------------------------------------
def test_gsm8k_tool_scores_against_the_rows_ground_truth_as_verl_does():
    tool = Gsm8kTool({"type": "native"}, OpenAIFunctionToolSchema.model_validate(GSM8K_SCHEMA))
    tools = {tool.name: tool}
    kwargs = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}
    response, reward, _ = call(tools, "calc_gsm8k_reward", {"answer": "72"}, tools_kwargs=kwargs)
    assert response.text == "Current parsed answer='72' reward=1.0" and reward == 0.0
    response, reward, _ = call(tools, "calc_gsm8k_reward", {"answer": "71"}, tools_kwargs=kwargs)
    assert response.text == "Current parsed answer='71' reward=0.0" and reward == -0.05

    async def one_instance():  # the agent loop's own create / execute / calc_reward
        iid, _ = await tool.create(create_kwargs={"ground_truth": "1,000"})
        first = await tool.execute(iid, {"answer": "#### 1000"})
        again = await tool.execute(iid, {"answer": 1000})
        return first[1], again[1], await tool.calc_reward(iid)

    assert asyncio.run(one_instance()) == (0.0, -0.05, 1.0)


def test_the_code_tool_runs_python_in_the_local_sandbox_without_a_url():
    tool = SandboxFusionTool({"type": "native", "default_timeout": 2, "num_workers": 2})
    assert tool.name == "code_interpreter" and tool.pool.max_concurrency == 2
    response, _, metrics = call({tool.name: tool}, "code_interpreter", {"code": "print(6 * 7)"})
    assert response.text == "42\n" and metrics["tool/code_interpreter/stopped"] == 0.0
    response, _, _ = call({tool.name: tool}, "code_interpreter", {"code": "import time\ntime.sleep(30)", "timeout": 0.5})
    assert response.text.endswith("[stopped: wall time limit]")
    response, _, _ = call({tool.name: tool}, "code_interpreter", {"code": "x", "language": "cpp"})
    assert "not supported by the local sandbox" in response.text


class _FakeSandboxFusion(BaseHTTPRequestHandler):
    """Speaks Sandbox Fusion's run_code API: Python code 'TIMEOUT' times out, 'COMPILE' fails to
    compile, anything else echoes what it was sent."""

    requests: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, body))
        if body["code"] == "TIMEOUT":
            run = {"status": "TimeLimitExceeded", "execution_time": body["run_timeout"], "return_code": None,
                   "stdout": "partial", "stderr": ""}
            reply = {"status": "Failed", "message": "", "compile_result": None, "run_result": run}
        elif body["code"] == "COMPILE":
            reply = {"status": "Failed", "message": "", "run_result": None,
                     "compile_result": {"status": "Finished", "return_code": 1, "stdout": "", "stderr": "error: x"}}
        else:
            run = {"status": "Finished", "execution_time": 0.01, "return_code": 0,
                   "stdout": f"ran {body['language']} with {body['memory_limit_MB']} MB\n", "stderr": "warn\n"}
            reply = {"status": "Success", "message": "", "compile_result": None, "run_result": run}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def sandbox_fusion_url():
    _FakeSandboxFusion.requests = []
    server = HTTPServer(("127.0.0.1", 0), _FakeSandboxFusion)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/run_code"
    server.shutdown()
    server.server_close()


def test_the_code_tool_talks_to_a_sandbox_fusion_server(sandbox_fusion_url):
    tool = SandboxFusionTool({"type": "native", "sandbox_fusion_url": sandbox_fusion_url, "memory_limit_mb": 256,
                              "default_timeout": 7})
    tools = {tool.name: tool}
    response, _, metrics = call(tools, "code_interpreter", {"code": "print(1)"})
    assert response.text == "ran python with 256 MB\nwarn\n" and metrics["tool_errors"] == 0.0
    path, body = _FakeSandboxFusion.requests[-1]
    assert path == "/run_code"
    assert body == {"code": "print(1)", "language": "python", "run_timeout": 7.0, "memory_limit_MB": 256}
    response, _, _ = call(tools, "code_interpreter", {"code": "TIMEOUT", "timeout": 3})
    assert response.text == "partial\n[stopped: wall time limit]"
    assert _FakeSandboxFusion.requests[-1][1]["run_timeout"] == 3.0
    response, _, _ = call(tools, "code_interpreter", {"code": "COMPILE", "language": "cpp"})
    assert response.text == "error: x"
    assert run_code_endpoint("http://h:1/") == "http://h:1/run_code"


def test_an_unreachable_sandbox_fusion_server_is_an_error_text_not_a_crash(sandbox_fusion_url):
    tool = SandboxFusionTool({"type": "native", "sandbox_fusion_url": "http://127.0.0.1:9/run_code"})
    _assert_error(call({tool.name: tool}, "code_interpreter", {"code": "print(1)"}), "exception",
                  "Sandbox Fusion at http://127.0.0.1:9/run_code cannot be reached")


def test_verls_builtin_tool_classes_load_from_a_config_by_verls_names(tmp_path):
    path = tmp_path / "sandbox_fusion_tool_config.yaml"
    path.write_text(textwrap.dedent("""
        tools:
          - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
            config:
              sandbox_fusion_url: ""
              num_workers: 3
              enable_global_rate_limit: true
              rate_limit: 2
              default_timeout: 5
              default_language: python
              memory_limit_mb: 512
              type: native
            tool_schema:
              type: function
              function:
                name: code_interpreter
                description: A tool for executing code.
                parameters:
                  type: object
                  properties:
                    code: {type: string, description: The code to execute.}
                  required: [code]
    """))
    (tool,) = load_tool_config(path)
    assert isinstance(tool, SandboxFusionTool) and tool.pool.max_concurrency == 2
    assert tool.pool.limits.memory_mb == 512 and tool.default_timeout == 5.0


def test_a_function_tools_return_value_becomes_text_reward_and_metrics():
    from grpo_dist.tools.function_tool import as_tool_result

    assert as_tool_result("hi") == (ToolResponse(text="hi"), 0.0, {})
    assert as_tool_result(("hi", 0.5)) == (ToolResponse(text="hi"), 0.5, {})
    assert as_tool_result((ToolResponse(text="x"), None, {"n": 1})) == (ToolResponse(text="x"), 0.0, {"n": 1})
    assert as_tool_result(("a", "b")) == (ToolResponse(text='["a", "b"]'), 0.0, {})  # data, not a result
    assert as_tool_result({"k": [1, 2]}) == (ToolResponse(text='{"k": [1, 2]}'), 0.0, {})
    assert as_tool_result(None) == (ToolResponse(), 0.0, {})


def test_a_sync_function_tool_that_hangs_or_exits_does_not_stop_the_caller():
    import sys
    import time

    @function_tool
    def slow(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long
        """
        time.sleep(seconds)
        return "woke"

    @function_tool
    def quit_now(code: int) -> str:
        """Exit.

        Args:
            code: the exit status
        """
        sys.exit(code)

    tools = {t.name: t for t in (FunctionTool(slow), FunctionTool(quit_now))}
    _assert_error(call(tools, "slow", {"seconds": 0.5}, timeout_s=0.1), "timeout", "'slow' did not finish within 0.1 s")
    _assert_error(call(tools, "quit_now", {"code": 3}), "exception", "'quit_now' raised RuntimeError: the tool called sys.exit(3)")
    _assert_error(call(tools, "slow", {"secs": 1}), "exception", "unexpected keyword argument 'secs'")
