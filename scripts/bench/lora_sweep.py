"""Learning-rate sweep of LoRA against full fine-tuning on SmolLM2-135M-Instruct, through the in-process API.

The held-out accuracy columns of scripts/bench/lora.py take a 2-core CPU about an hour per run, too slow to
choose LoRA's learning rate and alpha by experiment. This script runs the same task (the larger-of-two
numbers recipe: 8 prompts x 8 responses per step, responses cut at 16 tokens, temperature 1, the k3 KL loss
at verl's 0.001 against the base model, token-mean aggregation, gradient clipping at 1, one optimizer step
per batch, float32) with :class:`grpo_dist.GRPO` in one process per worker, so that many configurations and
seeds fit on one GPU (or, slowly, a CPU). Greedy held-out accuracy on the task's 256 test pairs is measured
before the first step and every ``--eval-every`` steps. The in-process API shares the policy loss, the
advantage estimator and the update step with the distributed trainer; it uses Adam without weight decay
where the trainer uses AdamW with verl's 0.01 (immaterial over a few dozen steps at these learning rates).

    python scripts/bench/lora_sweep.py --model DIR --steps 30 --runs full:0:1e-5 lora16:16:2e-4 --seeds 0 1
    python scripts/bench/lora_sweep.py --render results.jsonl

``--runs`` takes ``name:rank:lr[:alpha]`` (rank 0: full fine-tuning; alpha defaults to 2 x rank). Each run
appends one JSON line (configuration, seed, accuracy per evaluated step, seconds) to ``--out``; ``--render``
prints the markdown table of the mean accuracy over seeds per configuration and step.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse_run(text: str) -> dict:
    parts = text.split(":")
    if len(parts) not in (3, 4):
        raise SystemExit(f"--runs entry {text!r}: expected name:rank:lr[:alpha]")
    rank = int(parts[1])
    alpha = float(parts[3]) if len(parts) == 4 else 2.0 * rank
    return {"name": parts[0], "rank": rank, "lr": float(parts[2]), "alpha": alpha}


def chat_prompts(tokenizer, pairs) -> list[str]:
    from grpo_dist.tasks.larger import make_prompt

    return [tokenizer.apply_chat_template(make_prompt(a, b), tokenize=False, add_generation_prompt=True)
            for a, b in pairs]


_QUESTION = re.compile(r"larger, (\d+) or (\d+)\?")


def answer_in(prompt: str) -> int:
    """The larger of the two numbers the prompt asks about (the task's ground truth)."""
    a, b = _QUESTION.findall(prompt)[-1]
    return max(int(a), int(b))


def greedy_accuracy(model, tokenizer, prompts: list[str], answers: list[int], device, max_new_tokens: int,
                    batch: int = 128) -> float:
    """Greedy exact-answer accuracy (the task's reward: the first number of the response is the larger)."""
    import torch

    from grpo_dist.tasks.larger import score

    tokenizer.padding_side = "left"
    right = 0.0
    model.eval()
    with torch.no_grad():
        for s in range(0, len(prompts), batch):
            enc = tokenizer(prompts[s:s + batch], return_tensors="pt", padding=True).to(device)
            out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            right += sum(score(t, g) for t, g in zip(texts, answers[s:s + batch]))
    return right / len(prompts)


def one_run(spec: dict, seed: int, args: argparse.Namespace, device: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_dist import GRPO
    from grpo_dist.tasks.larger import score, split_pairs

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:  # a folder converted from the GGUF file names none: pad with EOS (masked)
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(device)
    pairs = split_pairs(seed=0)
    train = list(pairs["train"])
    random.Random(seed).shuffle(train)
    test = pairs["test"][: args.val_samples] if args.val_samples else pairs["test"]
    test_prompts = chat_prompts(tokenizer, test)
    test_answers = [max(a, b) for a, b in test]

    def reward_fn(completions, prompts):
        return [score(c, answer_in(p)) for c, p in zip(completions, prompts)]

    trainer = GRPO(model=model, reward_fn=reward_fn, group_size=8, kl_coef=0.001, learning_rate=spec["lr"],
                   max_new_tokens=16, max_grad_norm=1.0, temperature=1.0, batch_size=8,
                   loss_agg_mode="token-mean", kl_loss_type="low_var_kl", kl_loss_agg_mode="token-mean",
                   tokenizer=tokenizer, device=device, seed=seed, progress=False,
                   lora_rank=spec["rank"], lora_alpha=spec["alpha"] if spec["rank"] else 16.0)
    acc = {0: greedy_accuracy(trainer.model, tokenizer, test_prompts, test_answers, device, 16)}
    rewards = []
    start = time.time()
    for step in range(1, args.steps + 1):
        batch = train[(step - 1) * 8: step * 8]
        m = trainer.step(chat_prompts(tokenizer, batch))
        rewards.append(m["mean_reward"])
        if step % args.eval_every == 0 or step == args.steps:
            acc[step] = greedy_accuracy(trainer.model, tokenizer, test_prompts, test_answers, device, 16)
    return {**spec, "seed": seed, "acc": acc, "reward": rewards, "seconds": time.time() - start}


def worker(jobs, args, device, out_path, lock):
    for spec, seed in jobs:
        try:
            row = one_run(spec, seed, args, device)
        except Exception as exc:  # one failed configuration must not lose the others
            row = {**spec, "seed": seed, "error": repr(exc)[:500]}
        with lock:
            with open(out_path, "a") as f:
                f.write(json.dumps(row) + "\n")
        print(json.dumps({k: row[k] for k in row if k != "reward"}), flush=True)


def render(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if "error" in r:
            print(f"# {r['name']} seed {r['seed']} failed: {r['error']}")
            continue
        groups.setdefault((r["name"], r["rank"], r["lr"], r["alpha"]), []).append(r)
    steps = sorted({int(s) for r in rows if "acc" in r for s in r["acc"]})
    head = "| configuration | rank | lr | alpha | seeds | " + " | ".join(f"step {s}" for s in steps) + " |"
    lines = [head, "|" + " --- |" * (5 + len(steps))]
    for (name, rank, lr, alpha), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        cells = []
        for s in steps:
            vals = [r["acc"][str(s)] if str(s) in r["acc"] else r["acc"].get(s) for r in rs]
            vals = [v for v in vals if v is not None]
            cells.append(f"{statistics.mean(vals):.3f}" + (f" ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else "")
                         if vals else "")
        lines.append(f"| {name} | {rank} | {lr:g} | {alpha:g} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a Hugging Face folder of SmolLM2-135M-Instruct")
    p.add_argument("--runs", nargs="+", default=["full:0:1e-5", "lora16:16:1e-4"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--val-samples", type=int, default=0, help="0: all 256 test pairs")
    p.add_argument("--workers", type=int, default=1, help="processes sharing the device")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=Path("lora_sweep.jsonl"))
    p.add_argument("--render", type=Path)
    args = p.parse_args()
    if args.render:
        print(render(args.render))
        return
    jobs = [(parse_run(r), s) for s in args.seeds for r in args.runs]
    shards = [jobs[i::args.workers] for i in range(args.workers)]
    ctx = mp.get_context("spawn")
    lock = ctx.Lock()
    procs = [ctx.Process(target=worker, args=(shard, args, args.device, args.out, lock)) for shard in shards if shard]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    print(render(args.out))


if __name__ == "__main__":
    main()
