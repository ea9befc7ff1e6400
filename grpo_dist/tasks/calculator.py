"""The embedded agent task: add two long numbers with a calculator tool.

Prompt (one user message): ``add 4821376 908172``; the right answer is the sum's digits, ``5729548``.
The numbers have 5 to 7 digits: too long for the tiny model to add in its head, so the way to the reward
is the tool ``add(a, b)`` (:mod:`grpo_dist.tasks.calculator_tools`, ``builtin:calculator/tools``), called
in hermes format and its result copied as the answer::

    <|im_start|>assistant
    <tool_call>
    {"name": "add", "arguments": {"a": 4821376, "b": 908172}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    5729548
    </tool_response><|im_end|>
    <|im_start|>assistant
    5729548<|im_end|>

The reward (data_source ``grpo_dist/calculator``) is 1.0 when the final answer is exactly the sum and 0.0
otherwise (:func:`final_answer`, :func:`score`). Rows carry ``agent_name: tool_agent`` and
``extra_info.tools_kwargs: {}``, so ``rollout.mode=async`` with ``multi_turn.enable=true`` runs them through
the tool agent loop. 4,096 training and 256 test prompts, no pair in both, written once as JSON lines
(parquet cannot hold the empty ``tools_kwargs`` mapping) under the grpo_dist cache.

The base model (``builtin:tiny-calculator``) is a small Qwen2-shaped model with a character tokenizer in
which ``<tool_call>``, ``</tool_call>``, ``<tool_response>`` and ``</tool_response>`` are single (not
special) tokens, and a Qwen2.5-style chat template (:data:`CHAT_TEMPLATE`) that lists the tools compactly in
the system message. A supervised warm-start on synthetic transcripts (loss on the assistant's tokens only)
teaches it the call format: half of them call the tool and copy its result, half answer at once with a
random number of the sum's length. So it calls the tool in about half of its samples and is almost never
right without it: what GRPO has to teach is to always call.

Measured (``scripts/build_calculator_task.py --evaluate 256``: :func:`evaluate` on the 256 test prompts at
temperature 1; the warm-up is deterministic, one CPU thread, 300 steps of 32 transcripts):

| build (2 shared CPU cores) | accuracy | well-formed call | call with the right numbers | result copied |
| --- | --- | --- | --- | --- |
| 171 s warm-up, 176 s in all (final loss 0.353) | 0.38 | 0.45 | 0.44 | 0.87 of right calls |

Direct answers are right about never (a random 5-8 digit number), so the accuracy is the call rate times the
copy rate: a policy that always calls would score about 0.87 from this start. Greedy, the warm model already
calls every time (0.94 on 64 test prompts), so held-out accuracy is measured sampled. The same warm model run
through the ``tool_agent`` loop (strict tokenization check) matched the chat template's one-shot rendering on
every trajectory.

    python scripts/build_calculator_task.py [--force] [--evaluate N]   # build (or rebuild) it explicitly
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

from grpo_dist.tasks.reverse import _build_once

DATA_SOURCE = "grpo_dist/calculator"
VERSION = "v1"
MIN_DIGITS, MAX_DIGITS = 5, 7
N_TRAIN, N_TEST = 4096, 256
TOOLS_FILE = Path(__file__).with_name("calculator_tools.py")
"""The function-tool file (``builtin:calculator/tools``)."""

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
EXTRA_TOKENS = (TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END)
"""One token each in the tiny model's tokenizer (added, not special: a decoded response keeps them)."""
VOCAB = list("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ \n{}[]\":,.()#_-+'")

CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] is defined and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] or '' -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set system = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- if system or tools -%}{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}{{- ('\\n' if system else '') + '# Tools' -}}"
    "{%- for tool in tools -%}"
    "{%- set f = tool['function'] if tool['function'] is defined else tool -%}"
    "{%- set params = f['parameters']['properties'] if f['parameters'] is defined"
    " and f['parameters']['properties'] is defined else {} -%}"
    "{{- '\\n' + f['name'] + '(' + (params | list | join(', ')) + ')' -}}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for message in rest -%}"
    "{%- if message['role'] is not defined -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + (message['content'] or '') + '\\n</tool_response>' -}}"
    "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{{- '<|im_start|>assistant' -}}"
    "{%- if message['content'] -%}{{- '\\n' + message['content'] -}}{%- endif -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set call = call['function'] if call['function'] is defined else call -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' -}}"
    "{%- if call['arguments'] is string -%}{{- call['arguments'] -}}"
    "{%- else -%}{{- call['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""Qwen2.5's hermes template, compact (the tiny model's context is short). With tools, the system message
(the conversation's own text, if any, then) lists each tool as ``name(arg, ...)`` under ``# Tools``:
``<|im_start|>system\\n# Tools\\nadd(a, b)<|im_end|>\\n``; with neither tools nor a system message there is
no system message (no default system prompt). An assistant
message's ``tool_calls`` (verl's ``{"type": "function", "function": {name, arguments}}`` or bare
``{name, arguments}``) follow its content as ``\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
tool messages become one user message, ``<|im_start|>user`` + ``\\n<tool_response>\\n{content}\\n</tool_response>``
per consecutive tool message + ``<|im_end|>\\n``; other messages are ChatML. An earlier message renders the
same whatever follows it, so an agent loop's turn-by-turn tokens equal the one-shot rendering. A message
without a role (``[{}]``, verl's way of rendering the system prefix alone) renders nothing."""

# ------------------------------------------------------------------------------------------ task
def make_prompt(a: int, b: int) -> list[dict]:
    return [{"role": "user", "content": f"add {a} {b}"}]


def _number(rng: random.Random) -> int:
    digits = rng.randint(MIN_DIGITS, MAX_DIGITS)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def final_answer(solution_str: str) -> str:
    """The trajectory's last answer: the text after its last ``</tool_response>`` (without the chat
    template's ``assistant`` line that starts the next turn, decoded with or without special tokens), or
    the whole text when no tool responded; white space stripped."""
    text = solution_str.replace("<|im_end|>", "")
    if TOOL_RESPONSE_END in text:
        text = text.rsplit(TOOL_RESPONSE_END, 1)[1].replace("<|im_start|>", "").lstrip()
        if text.startswith("assistant"):
            text = text[len("assistant"):]
    return text.strip()


def score(solution_str: str, ground_truth, extra_info=None) -> float:
    """1.0 when the final answer (:func:`final_answer`) is exactly ``ground_truth`` (the sum's digits), else 0.0."""
    return 1.0 if final_answer(solution_str) == str(ground_truth).strip() else 0.0


def _register() -> None:
    from grpo_dist.rewards.scorers import DEFAULT_REGISTRY

    if DATA_SOURCE not in DEFAULT_REGISTRY:
        DEFAULT_REGISTRY.register(DATA_SOURCE)(score)


_register()


# ------------------------------------------------------------------------------------------ data
def split_pairs(*, seed: int = 0) -> dict[str, list[tuple[int, int]]]:
    """Disjoint train/test lists of ordered pairs ``(a, b)``; no test pair is in train in either order."""
    rng = random.Random(seed)
    test: list[tuple[int, int]] = []
    held: set[frozenset] = set()
    while len(test) < N_TEST:
        pair = (_number(rng), _number(rng))
        if frozenset(pair) not in held:
            held.add(frozenset(pair))
            test.append(pair)
    train: list[tuple[int, int]] = []
    while len(train) < N_TRAIN:
        pair = (_number(rng), _number(rng))
        if frozenset(pair) not in held:
            held.add(frozenset(pair))
            train.append(pair)
    return {"train": train, "test": test}


def make_row(a: int, b: int, split: str, index: int) -> dict:
    """One row in verl's format, for the tool agent loop."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": make_prompt(a, b),
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "agent_name": "tool_agent",
        "extra_info": {"split": split, "index": index, "tools_kwargs": {}},
    }


def write_data(out_dir: Path, *, seed: int = 0) -> dict[str, Path]:
    """``train.jsonl`` / ``test.jsonl`` in ``out_dir``; their paths by split."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, pairs in split_pairs(seed=seed).items():
        path = out_dir / f"{split}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for i, (a, b) in enumerate(pairs):
                f.write(json.dumps(make_row(a, b, split, i)) + "\n")
        paths[split] = path
    return paths


def ensure_data(cache: str | os.PathLike) -> dict[str, Path]:
    """The splits' files under ``cache``, written once (under a file lock)."""
    folder = Path(cache) / f"calculator-data-{VERSION}"
    paths = {"train": folder / "train.jsonl", "test": folder / "test.jsonl"}
    _build_once(folder, paths.values(), Path(cache) / ".calculator-data.lock", write_data)
    return paths


def tool_schemas() -> list[dict]:
    """The tool file's schemas, as an agent loop passes them to the chat template (``tools=``)."""
    from grpo_dist.tools.function_tool import load_function_tools

    return [t.tool_schema.model_dump(exclude_none=True) for t in load_function_tools(TOOLS_FILE)]


# ----------------------------------------------------------------------------------- transcripts
def call_text(a, b) -> str:
    """A model turn that calls the tool (before its ``<|im_end|>``), as the chat template renders the call."""
    return f'{TOOL_CALL}\n{json.dumps({"name": "add", "arguments": {"a": a, "b": b}})}\n{TOOL_CALL_END}'


def tool_turn_text(content: str) -> str:
    """What follows a model turn's ``<|im_end|>`` up to the next model turn: the template's newline, the
    tool message, the generation prompt."""
    return f"\n<|im_start|>user\n{TOOL_RESPONSE}\n{content}\n{TOOL_RESPONSE_END}<|im_end|>\n<|im_start|>assistant\n"


def transcript(tokenizer, tools: list[dict], a: int, b: int, direct_answer: str | None = None) -> list[tuple[str, bool]]:
    """A warm-start transcript as ``(text, trained)`` pieces whose concatenation is the chat template's
    rendering of the conversation: the prompt (not trained), then either a tool call (trained), the tool
    turn (not trained) and the copied sum (trained), or, with ``direct_answer``, that answer at once."""
    prompt = tokenizer.apply_chat_template(make_prompt(a, b), tools=tools, add_generation_prompt=True, tokenize=False)
    if direct_answer is not None:
        return [(prompt, False), (direct_answer + "<|im_end|>", True), ("\n", False)]
    total = str(a + b)
    return [(prompt, False), (call_text(a, b) + "<|im_end|>", True), (tool_turn_text(total), False),
            (total + "<|im_end|>", True), ("\n", False)]


# ----------------------------------------------------------------------------------------- model
def warm_up(model_dir: Path, *, steps: int, batch_size: int = 32, lr: float = 3e-3, seed: int = 0,
            tool_fraction: float = 0.5, log_every: int = 0) -> dict:
    """Supervised warm-start on :func:`transcript` s: a tool call with probability ``tool_fraction``, else a
    direct answer of a random number with as many digits as the sum. Loss on the trained pieces only."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_dist.tasks.warmup import supervised_step

    torch.manual_seed(seed)
    rng = random.Random(seed + 1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.train()
    tools = tool_schemas()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / steps))
    pad_id = tok.pad_token_id
    t0 = time.perf_counter()
    loss_val = float("nan")
    for step in range(steps):
        seqs, labels = [], []
        for _ in range(batch_size):
            a, b = _number(rng), _number(rng)
            direct = None
            if rng.random() >= tool_fraction:
                n = len(str(a + b))
                direct = str(rng.randint(10 ** (n - 1), 10**n - 1))
            ids: list[int] = []
            lab: list[int] = []
            for text, trained in transcript(tok, tools, a, b, direct):
                piece = tok.encode(text, add_special_tokens=False)
                ids += piece
                lab += piece if trained else [-100] * len(piece)
            seqs.append(ids)
            labels.append(lab)
        loss_val = supervised_step(model, opt, sched, seqs, labels, pad_id)
        if log_every and (step + 1) % log_every == 0:
            print(f"warm-up step {step + 1}/{steps}: loss {loss_val:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    model.save_pretrained(model_dir)
    return {"steps": steps, "final_loss": loss_val, "seconds": time.perf_counter() - t0}


def build_model(out_dir: Path, *, warmup_steps: int = 300, batch_size: int = 32, seed: int = 0,
                log_every: int = 0) -> Path:
    """The tiny model with its tokenizer and template, warmed up (:func:`warm_up`) on one CPU thread: at this
    size a second thread saves little on an idle machine and costs several times over on a busy one
    (measured on 2 shared cores: 0.7 s against 2-5 s per step)."""
    import torch

    from grpo_dist.utils.tiny_model import build_tiny_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        build_tiny_model(out_dir, vocab=VOCAB, hidden_size=128, num_layers=4, num_heads=2, num_kv_heads=2,
                         head_dim=64, intermediate_size=256, max_position_embeddings=512, seed=seed,
                         extra_tokens=EXTRA_TOKENS, chat_template=CHAT_TEMPLATE)
        info = warm_up(out_dir, steps=warmup_steps, batch_size=batch_size, seed=seed, log_every=log_every)
    finally:
        torch.set_num_threads(threads)
    (out_dir / "grpo_dist_task.json").write_text(json.dumps({"task": "calculator", "version": VERSION, **info}))
    return out_dir


def ensure_model(cache: str | os.PathLike) -> Path:
    final = Path(cache) / f"tiny-calculator-{VERSION}"
    _build_once(final, [final / "grpo_dist_task.json"], Path(cache) / ".tiny-calculator.lock", build_model,
                note=f"grpo_dist: building the calculator task's base model in {final} (one time, a few minutes)")
    return final


# ------------------------------------------------------------------------------------ evaluation
@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` measured over ``n`` test prompts.

    Attributes:
        accuracy: share of trajectories whose final answer is the sum (:func:`score`).
        tool_use_rate: share whose first turn holds a well-formed call of ``add`` (a JSON object that
            names it, with both arguments).
        correct_call_rate: share whose call has exactly the prompt's two numbers.
        copy_rate: among trajectories whose call was correct, the share that answered with the tool's result.
        n: prompts evaluated.
        seconds: wall time.
    """

    accuracy: float
    tool_use_rate: float
    correct_call_rate: float
    copy_rate: float
    n: int
    seconds: float


def _first_call(text: str) -> dict | None:
    """The first hermes call in ``text`` as ``{"name", "arguments"}``, or None when there is none or it is
    not a JSON object with a name and an arguments object."""
    found = re.search(re.escape(TOOL_CALL) + r"(.*?)" + re.escape(TOOL_CALL_END), text, re.DOTALL)
    if not found:
        return None
    try:
        value = json.loads(found.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not isinstance(value.get("arguments"), dict):
        return None
    return value


def evaluate(model_dir: str | os.PathLike, n: int = 256, *, temperature: float = 1.0, seed: int = 0,
             max_assistant_turns: int = 2, data: str | os.PathLike | None = None,
             batch_size: int = 64) -> Evaluation:
    """Run the tool transcript loop with Hugging Face ``generate`` (no vLLM) on the first ``n`` test prompts.

    Each trajectory: the prompt rendered with the tool schemas; a model turn (sampled at ``temperature``,
    until ``<|im_end|>``); when it holds hermes calls, the first is run through the real tool layer
    (:func:`grpo_dist.tools.calls.run_tool_call`, errors become text for the model), the tool turn appended,
    and the model answers again, up to ``max_assistant_turns`` model turns (a block that is not a JSON call
    gets an error text, as in the agent loop). The trajectory's decoded response is scored by :func:`score`.
    ``data`` is the test file (default: the cached test split).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_dist.data.rows import load_rows
    from grpo_dist.tasks.cache import cache_root
    from grpo_dist.tools.calls import ERROR_PREFIX, run_tool_call
    from grpo_dist.tools.registry import load_tools

    t0 = time.perf_counter()
    rows = load_rows(str(data) if data else str(ensure_data(cache_root())["test"]))[:n]
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tools = load_tools(function_tool_path=TOOLS_FILE)
    schemas = [t.tool_schema.model_dump(exclude_none=True) for t in tools.values()]
    end_id = tok.convert_tokens_to_ids("<|im_end|>")
    torch.manual_seed(seed)

    def generate(contexts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        outs = []
        for lo in range(0, len(contexts), batch_size):
            chunk = contexts[lo: lo + batch_size]
            width = max(len(c) for c in chunk)
            ids = torch.full((len(chunk), width), tok.pad_token_id)
            att = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, c in enumerate(chunk):  # left padding
                ids[i, width - len(c):] = torch.tensor(c)
                att[i, width - len(c):] = 1
            with torch.no_grad():
                gen = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new_tokens,
                                     do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                                     top_k=None, top_p=None, pad_token_id=tok.pad_token_id)
            for row in gen[:, width:].tolist():
                cut = row.index(end_id) + 1 if end_id in row else len(row)
                outs.append([t for t in row[:cut] if t != tok.pad_token_id])
        return outs

    prompts = [tok.encode(tok.apply_chat_template(r["prompt"], tools=schemas, add_generation_prompt=True,
                                                  tokenize=False), add_special_tokens=False) for r in rows]
    responses: list[list[int]] = [[] for _ in rows]
    active = list(range(len(rows)))
    first_calls: list[dict | None] = [None] * len(rows)
    for turn in range(max_assistant_turns):
        if not active:
            break
        outs = generate([prompts[i] + responses[i] for i in active], 96)
        still = []
        for i, out in zip(active, outs):
            responses[i] += out
            text = tok.decode(out, skip_special_tokens=True)
            call = _first_call(text)
            if turn == 0:
                first_calls[i] = call
            if TOOL_CALL not in text or out[-1:] != [end_id] or turn + 1 == max_assistant_turns:
                continue
            if call is None:  # as the agent loop answers a block it cannot parse
                reply = ERROR_PREFIX + "the tool call must be a JSON object with a string 'name' and 'arguments'"
            else:
                reply = asyncio.run(run_tool_call(tools, call["name"], call["arguments"], max_chars=256))[0].text or ""
            responses[i] += tok.encode(tool_turn_text(reply), add_special_tokens=False)
            still.append(i)
        active = still

    correct = used = right_call = copied = 0
    for r, resp, call in zip(rows, responses, first_calls):
        text = tok.decode(resp, skip_special_tokens=True)
        ok = score(text, r["reward_model"]["ground_truth"])
        correct += ok
        args = call["arguments"] if call else {}
        if call and call["name"] == "add" and set(args) == {"a", "b"}:
            used += 1
            a, b = (int(x) for x in r["prompt"][0]["content"].split()[1:])
            if args == {"a": a, "b": b}:
                right_call += 1
                copied += ok
    k = max(1, len(rows))
    return Evaluation(accuracy=correct / k, tool_use_rate=used / k, correct_call_rate=right_call / k,
                      copy_rate=copied / max(1, right_call), n=len(rows), seconds=time.perf_counter() - t0)
