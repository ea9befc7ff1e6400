"""Write a tiny random Qwen2 model and its character-level tokenizer to a directory.

    python scripts/build_tiny_model.py OUT_DIR [--hidden-size 64] [--num-layers 2] ...

The directory loads with ``AutoModelForCausalLM.from_pretrained``, ``AutoTokenizer.from_pretrained``
and ``vllm.LLM(model=OUT_DIR)``. See ``grpo_dist.utils.tiny_model.build_tiny_model``.
"""

from __future__ import annotations

import argparse

from grpo_dist.utils.tiny_model import build_tiny_model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="directory to write")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=1)
    parser.add_argument("--num-kv-heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=64, help="32, 64, 128, ... (vLLM CPU)")
    parser.add_argument("--intermediate-size", type=int, default=128)
    parser.add_argument("--max-position-embeddings", type=int, default=512)
    parser.add_argument(
        "--vocab",
        default=None,
        help="the tokenizer's characters as one string, e.g. '0123456789+= ' (default: printable ASCII)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = build_tiny_model(
        args.out_dir,
        vocab=None if args.vocab is None else list(args.vocab),
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        head_dim=args.head_dim,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=args.max_position_embeddings,
        seed=args.seed,
    )
    print(out)


if __name__ == "__main__":
    main()
