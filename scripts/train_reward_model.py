#!/usr/bin/env python
"""Train a starting reward model on a base policy's own samples, labelled by the rule-based verifier.

    python scripts/train_reward_model.py --policy MODEL_DIR --data train.parquet --out RM_DIR \\
        [--prompts 512] [--n 4] [--max-new-tokens 16] [--steps 200] [--lr 1e-4] [--seed 0] \\
        [--custom-reward-path FILE --custom-reward-name compute_score]
    python scripts/train_reward_model.py --embedded   # the embedded task's (cached, as tests use it)

The data file is in verl's row format; each response is scored by the built-in scorer of its row's
``data_source`` (or the custom function), 1 correct and 0 not, and a one-output head on the policy's
backbone learns to tell them apart (grpo_dist/training/reward_model_warmup.py). ``RM_DIR`` then goes
to ``reward_model.model.path`` (with ``reward_model.enable=true``, and ``reward_model.iterative.enable=true``
to keep training it during the run).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embedded", action="store_true", help="the embedded reverse task's starting reward model (cached)")
    ap.add_argument("--policy", help="the base policy's Hugging Face folder")
    ap.add_argument("--data", nargs="+", help="parquet/jsonl files of prompts (verl's row format)")
    ap.add_argument("--out", help="folder to write the reward model to")
    ap.add_argument("--prompts", type=int, default=512, help="prompts drawn from the data (default: %(default)s)")
    ap.add_argument("--n", type=int, default=4, help="responses sampled per prompt (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="longest response (default: %(default)s)")
    ap.add_argument("--max-prompt-length", type=int, default=512, help="longest prompt (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps (default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=32, help="samples per step (default: %(default)s)")
    ap.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default: %(default)s)")
    ap.add_argument("--last-token-only", action="store_true",
                    help="label only whole responses (default: every prefix, labelled by the verifier)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--custom-reward-path", help="a Python file with the verifier (default: the built-in scorers)")
    ap.add_argument("--custom-reward-name", default="compute_score")
    args = ap.parse_args()

    from grpo_dist import tasks

    if args.embedded:
        from grpo_dist.tasks import reverse

        path = reverse.ensure_reward_model(tasks.cache_root())
        print(f"reward model: {path}")
        print((path / "grpo_dist_reward_model.json").read_text())
        return
    if not (args.policy and args.data and args.out):
        ap.error("give --policy, --data and --out (or --embedded)")

    from transformers import AutoTokenizer

    from grpo_dist.data.dataset import PromptDataset
    from grpo_dist.training.reward_model_warmup import sample_and_label, train_reward_model

    policy = tasks.resolve(args.policy)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    data = PromptDataset.from_files([tasks.resolve(p) for p in args.data], tokenizer, prompt_key="prompt",
                                    max_prompt_length=args.max_prompt_length, filter_overlong_prompts=True,
                                    truncation="error")
    rng = random.Random(args.seed)
    picks = rng.sample(range(len(data)), min(args.prompts, len(data)))
    items = [(data[i]["prompt_ids"], data[i]["data_source"], data[i]["ground_truth"], data[i]["extra_info"]) for i in picks]
    if args.custom_reward_path:
        from grpo_dist.rewards.custom import load_custom_reward_fn

        fn = load_custom_reward_fn(args.custom_reward_path, args.custom_reward_name)
    else:
        from grpo_dist.rewards.scorers import default_compute_score as fn

    def label(source, text, truth, extra):
        out = fn(source, text, truth, extra)
        return float(out["score"] if isinstance(out, dict) else out)

    rows = sample_and_label(policy, items, label, n=args.n, max_new_tokens=args.max_new_tokens,
                            every_prefix=not args.last_token_only, seed=args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = train_reward_model(policy, out, rows, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                seed=args.seed, log_every=max(1, args.steps // 10))
    (out / "grpo_dist_reward_model.json").write_text(json.dumps({"policy": str(policy), **report}))
    print(json.dumps(report, indent=1))
    print(f"reward model: {out}")


if __name__ == "__main__":
    main()
