"""`nitsum chat "question"`: answer one chat prompt with the offline engine."""

from __future__ import annotations

import argparse

from nitsum.llm import LLM
from nitsum.sampling import SamplingParams


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nitsum chat", description=__doc__)
    ap.add_argument("prompt", help="the user message")
    ap.add_argument("--model", default=None, help="model name, HF dir or GGUF (default: embedded)")
    ap.add_argument("--system", default=None, help="optional system message")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.prompt})
    llm = LLM(args.model)
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    print(llm.chat(messages, params)[0].text)
    return 0
