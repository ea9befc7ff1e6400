"""Greedy responses of a fresh in-process vLLM engine, as a program: ``python vllm_greedy.py '<json>'`` with
``{"model", "len", "prompts", "max_tokens"}``; prints ``RESULT`` and the JSON of ``[response ids, finished by EOS]``.

A test that needs a second engine runs this in a process of its own (an in-process engine cannot be closed without
tearing down vLLM's process-wide state, which the test module's engine uses); on the test session's cluster it is
forked from the warm process that has torch and vLLM imported (tests/warm_workers.py), as the runs' workers are.
"""

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from grpo_dist.rollout import SamplingSettings, make_engine  # noqa: E402


def main() -> None:
    args = json.loads(sys.argv[1])
    engine = make_engine("vllm", model_path=args["model"], dtype="float32", max_model_len=args["len"], seed=0,
                         kv_cache_gib=0.25)
    out = engine.generate(args["prompts"], SamplingSettings.greedy(max_tokens=args["max_tokens"]))
    print("RESULT" + json.dumps([out.response_ids, out.finished_by_eos]), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
