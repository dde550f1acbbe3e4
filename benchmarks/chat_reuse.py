"""A multi-turn chat with and without prefix reuse, side by side in one process.

    python benchmarks/chat_reuse.py ENGINE [--max-new-tokens 96] [--repeats 2]

Each repeat runs the same four user turns twice, prefilling every turn's whole
conversation and reusing what the previous turn left in the KV cache
(`specc.runtime.prefix_reuse`), alternating. Per turn it prints the prompt's
tokens, how many were reused, the median prefill time of each mode, and
whether the two modes wrote the same reply (in bfloat16 they may part: see
docs/cli.md#prefix-reuse).
"""

from __future__ import annotations

import argparse
import statistics

from specc.contract.sampling import SamplingConfig
from specc.data.chat import conversation_ids
from specc.engine.loaded import load_engine
from specc.runtime.textgen import generate_text

TURNS = ("Write a short poem about the sea.", "Now make it about mountains instead.",
         "Explain the difference between the two poems in three sentences.", "Summarize our conversation.")


def conversation(engine, max_new_tokens: int, reuse: bool) -> list[dict]:
    history, turns = [], []
    for message in TURNS:
        messages = history + [{"role": "user", "content": message}]
        ids = conversation_ids(engine.tokenizer, messages)
        result = generate_text(engine, ids, max_new_tokens, SamplingConfig(), reuse_prefix=reuse)
        turns.append({"prompt": len(ids), "reused": result.stats.reused_prompt_tokens,
                      "prefill_ms": 1000 * result.stats.prefill_seconds, "reply": result.text})
        history = messages + [{"role": "assistant", "content": result.text}]
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    engine = load_engine(args.engine)
    conversation(engine, args.max_new_tokens, reuse=False)   # warm-up
    runs = {False: [], True: []}
    for _ in range(args.repeats):
        for reuse in (False, True):
            runs[reuse].append(conversation(engine, args.max_new_tokens, reuse))
    print("| turn | whole: prompt tokens | prefill ms | reusing: prompt tokens | reused | prefill ms | same reply |")
    print("|---|---|---|---|---|---|---|")
    for turn in range(len(TURNS)):
        whole, reused = runs[False][-1][turn], runs[True][-1][turn]
        ms = {mode: statistics.median(r[turn]["prefill_ms"] for r in runs[mode]) for mode in runs}
        print(f"| {turn + 1} | {whole['prompt']} | {ms[False]:.1f} | {reused['prompt']} | {reused['reused']} | "
              f"{ms[True]:.1f} | {'yes' if whole['reply'] == reused['reply'] else 'no'} |")


if __name__ == "__main__":
    main()
