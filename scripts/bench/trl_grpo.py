"""TRL's GRPOTrainer on the workload (one process, CPU or one GPU, Hugging Face generate: use_vllm=False).

    python scripts/bench/trl_grpo.py WORKLOAD_JSON OUT_JSON

Mapping of the workload onto GRPOConfig, so that one TRL optimizer step is one grpo_dist step:

- ``per_device_train_batch_size`` = micro_batch (sequences per forward/backward),
  ``gradient_accumulation_steps`` = batch_size * n / micro_batch, hence
  ``generation_batch_size`` = batch_size * n: one generation of ``batch_size`` prompts x ``n``
  completions and ONE optimizer step per step (``num_iterations=1``);
- ``num_generations`` = n, ``max_completion_length`` = response_length, same temperature/top_p/top_k;
- ``beta`` = kl_coef (k3 estimator, reference loaded from the model directory), ``epsilon`` = 0.2,
  ``loss_type="dapo"`` (token mean over the whole mini-batch, as grpo_dist's ``token-mean``),
  same learning rate, AdamW weight decay 0.01, grad clipping 1.0, constant schedule;
- gradient checkpointing off (as in the grpo_dist run), dropout off; on CPU float32 (``use_cpu``, no
  bf16), on CUDA ``bf16=True`` (float32 weights, bf16 autocast: grpo_dist's default mixed precision there);
- the dataset holds exactly the prompts grpo_dist draws, step by step, and is not shuffled;
- with ``lora_rank`` in the workload (run_bench.py --lora-rank): a peft ``LoraConfig`` of that rank, alpha twice
  it, every linear layer, as ``peft_config``; TRL's reference is then the base model with the adapters off.

Measured from outside TRL's code: the wall time between optimizer steps (a TrainerCallback), the
generated tokens (counted in the reward function from ``completion_ids``), and the time spent in
``_generate_single_turn`` and in no-grad log-prob forwards (wrapped on the trainer instance).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench_common import is_bf16, load_prompt_dataset, peft_lora_config, subprocess_main  # noqa: E402


def run(w: dict) -> dict:
    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from grpo_dist.tasks import reverse
    from trl import GRPOConfig, GRPOTrainer

    tok, ds = load_prompt_dataset(w)
    items = [ds[i] for idx in w["step_prompts"] for i in idx]
    train = Dataset.from_list([{"prompt": it["raw_prompt"], "ground_truth": str(it["ground_truth"])} for it in items])

    gen_tokens: list[int] = []
    gen_computed: list[int] = []

    def reward_reverse(completions, ground_truth, completion_ids=None, **kwargs):
        if completion_ids is not None:
            gen_tokens.append(sum(len(c) for c in completion_ids))
            # Hugging Face generate runs every sequence of the batch until the longest one ends
            gen_computed.append(len(completion_ids) * max((len(c) for c in completion_ids), default=0))
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [reverse.score(t, g) for t, g in zip(texts, ground_truth)]

    per_step = w["batch_size"] * w["n"]
    if per_step % w["micro_batch"]:
        raise ValueError("batch_size * n must be a multiple of micro_batch")
    out_dir = tempfile.mkdtemp(prefix="trl_bench_")
    cuda = w.get("device") == "cuda"
    args = GRPOConfig(
        output_dir=out_dir,
        use_cpu=not cuda,
        bf16=is_bf16(w),
        fp16=False,
        per_device_train_batch_size=w["micro_batch"],
        gradient_accumulation_steps=per_step // w["micro_batch"],
        num_generations=w["n"],
        max_completion_length=w["response_length"],
        temperature=w["temperature"],
        top_p=w["top_p"],
        top_k=max(w["top_k"], 0),
        beta=w["kl_coef"],
        epsilon=0.2,
        num_iterations=1,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=w["lr"],
        weight_decay=0.01,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=w["steps"],
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        gradient_checkpointing=w["gradient_checkpointing"],
        disable_dropout=True,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        seed=w["seed"],
        log_completions=False,
        disable_tqdm=True,
    )

    marks: list[float] = []

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            marks.append(time.perf_counter())

    # with a peft model TRL's reference is the base model with the adapters off
    peft = {"peft_config": peft_lora_config(w)} if w.get("lora_rank") else {}
    trainer = GRPOTrainer(model=w["model_dir"], reward_funcs=[reward_reverse], args=args, train_dataset=train,
                          processing_class=tok, callbacks=[StepClock()], **peft)
    gen_s: list[float] = []
    fwd_s: list[float] = []
    # private methods of TRL 1.x: timed when present (the step times do not depend on them)
    orig_gen = getattr(trainer, "_generate_single_turn", None)
    orig_fwd = getattr(trainer, "_get_per_token_logps_and_entropies", None)

    def timed_gen(*a, **k):
        t = time.perf_counter()
        try:
            return orig_gen(*a, **k)
        finally:
            gen_s.append(time.perf_counter() - t)

    tokens: dict[str, list[int]] = {"nograd_computed": [], "nograd_real": [], "grad_computed": [], "grad_real": []}

    def count(kind: str, a, k) -> None:
        ids = k.get("input_ids", a[1] if len(a) > 1 else None)
        mask = k.get("attention_mask", a[2] if len(a) > 2 else None)
        if isinstance(ids, torch.Tensor) and isinstance(mask, torch.Tensor):
            tokens[f"{kind}_computed"].append(int(ids.numel()))
            tokens[f"{kind}_real"].append(int(mask.sum()))

    def timed_fwd(*a, **k):
        if torch.is_grad_enabled():
            count("grad", a, k)
            return orig_fwd(*a, **k)
        count("nograd", a, k)
        t = time.perf_counter()
        try:
            return orig_fwd(*a, **k)
        finally:
            fwd_s.append(time.perf_counter() - t)

    if orig_gen is not None:
        trainer._generate_single_turn = timed_gen
    if orig_fwd is not None:
        trainer._get_per_token_logps_and_entropies = timed_fwd
    trainer.train()

    steps = []
    for k in range(len(marks) - 1):
        steps.append({
            "step": k + 1,
            "seconds": marks[k + 1] - marks[k],
            "gen_tokens": gen_tokens[k] if k < len(gen_tokens) else None,
            "gen_s": gen_s[k] if k < len(gen_s) else None,
            "nograd_forward_s": fwd_s[k] if k < len(fwd_s) else None,
            "warmup": k < w["warmup_steps"],
        })
    # tokens per step (the forward calls of a step are summed: the no-grad ones of the reference, the
    # grad ones of the update, one per micro-batch)
    per = max(1, len(steps))
    for kind, vals in tokens.items():
        for k, row in enumerate(steps):
            chunk = len(vals) // per if vals else 0
            row[f"{kind}_tokens"] = sum(vals[k * chunk:(k + 1) * chunk]) if chunk else None
    for k, row in enumerate(steps):
        row["gen_tokens_computed"] = gen_computed[k] if k < len(gen_computed) else None
    out = {"steps": steps, "trl_version": trl.__version__, "threads": torch.get_num_threads()}
    if cuda:
        out["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


if __name__ == "__main__":
    subprocess_main(run)
