"""``eaglet generate``: one prompt, chat-templated, streamed; speculative with a draft, plain without."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from eaglet.commands.common import note, prepare, shard, tp_job
from eaglet.options import GenerateOptions
from eaglet.parallel.launch import is_main_process, run_tp
from eaglet.parallel.state import SINGLE, TPGroup


def run(opts: GenerateOptions) -> int:
    t = opts.target
    if tp_job(opts.tp):
        prepare(t, opts.tp)
        result = run_tp(opts.tp, generate_rank, opts, device=t.device)
    else:
        note(f"loading {t.target} on {t.device} ({t.dtype})")
        result = generate_rank(SINGLE, opts)
    if opts.json and is_main_process():
        print(json.dumps(result))
    return 0


def generate_rank(tp: TPGroup, opts: GenerateOptions) -> dict:
    """``eaglet generate`` on one rank (tp=1 included): rank 0 streams, every rank returns the result."""
    import torch

    from eaglet.chat import encode_chat
    from eaglet.generate import PlainGenerator
    from eaglet.speculative.load import resolve_draft, spec_engine

    main, t, params = tp.rank == 0, opts.target, opts.sampling
    # one prompt: a fused prefill would save ~3 ms after a compile of ~20-40 s, so only when asked
    engine = replace(opts.engine, compile_prefill=bool(opts.engine.compile_prefill))
    target = shard(tp, t)
    prompt = encode_chat(target.tokenizer, [{"role": "user", "content": opts.prompt}])
    draft_path = resolve_draft(opts.draft, target)
    if draft_path is None:
        if opts.draft == "default" and main:
            print(f"eaglet: no default draft ships for {t.target}; plain decoding", file=sys.stderr)
        gen = PlainGenerator(target, t.max_context, compile_prefill=engine.compile_prefill)
    streaming, held = False, []  # the engine's notes wait for the end of a streamed line

    def log(msg: str) -> None:
        if streaming:
            held.append(msg)
        else:
            print(f"eaglet: {msg}", file=sys.stderr)

    if draft_path is not None:
        if main:
            print(f"eaglet: draft {draft_path}", file=sys.stderr)
        gen = spec_engine(target, draft_path, t.max_context, engine, log)
    on_token = None
    if main:
        from transformers import TextStreamer

        streamer = TextStreamer(target.tokenizer, skip_special_tokens=True)

        def on_token(_row: int, token: int) -> None:
            nonlocal streaming
            streaming = True
            streamer.put(torch.tensor([token]))

    [done] = gen.generate([prompt], params, on_token=on_token)
    if main:
        streamer.end()
        sys.stdout.flush()
        for msg in held:
            print(f"eaglet: {msg}", file=sys.stderr)
        if done.finish_reason == "length" and len(done.tokens) < params.max_new_tokens:
            from eaglet.generate import context_size

            print(f"eaglet: the answer stopped after {len(done.tokens)} of --max-new-tokens {params.max_new_tokens} "
                  f"tokens: prompt and answer filled the {context_size(target, t.max_context)}-token context; "
                  "raise --max-context for a longer answer", file=sys.stderr)
    accept = done.accept_lengths
    return {
        "text": target.tokenizer.decode(done.tokens, skip_special_tokens=True),
        "prompt_tokens": len(prompt),
        "completion_tokens": len(done.tokens),
        "finish_reason": done.finish_reason,
        "seconds": round(done.seconds, 4),
        "tokens_per_s": round(done.tokens_per_s, 2),
        "draft": str(draft_path) if draft_path else None,
        "accept_length": round(sum(accept) / len(accept), 3) if accept else None,
        "tp": tp.size,
    }
