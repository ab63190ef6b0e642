"""Check a load test of `eaglet serve` (docs/performance.md, "Serving on the CPU").

Reads the report of `eaglet bench --endpoint` and the server's /metrics, and
1. compares the server's totals with what the clients received (requests finished,
   completion and prompt tokens);
2. re-decodes every distinct prompt offline, greedy, one at a time, with the engine
   `eaglet generate` builds for the same target and draft, and counts the answers the
   server gave that are identical to it.

    python scripts/serve_load_check.py --report runs/load/report.json --metrics http://127.0.0.1:8000/metrics \
        --max-context 1024
"""

from __future__ import annotations

import argparse
import json

import httpx
import torch

from eaglet.chat import encode_chat
from eaglet.options import ServeConfig, TargetOptions
from eaglet.sampling import SamplingParams
from eaglet.serve.server import load_engine


def metric_totals(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url).text.splitlines():
        if line.startswith("eaglet_") and not line.startswith("#") and "_created" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="default")
    ap.add_argument("--max-context", type=int, default=None)
    args = ap.parse_args()
    report = json.loads(open(args.report).read())
    cfg, reqs = report["config"], report["requests"]
    m = metric_totals(args.metrics)
    ok = [r for r in reqs if r["ok"]]
    totals = {
        "requests": len(reqs), "failed": len(reqs) - len(ok),
        "finished (server)": m.get('eaglet_requests_total{outcome="finished"}', 0),
        "completion tokens (clients)": sum(r["completion_tokens"] for r in ok),
        "completion tokens (server)": m.get("eaglet_generation_tokens_total", 0),
        "prompt tokens (clients)": sum(r["prompt_tokens"] for r in ok),
        "prompt tokens (server)": m.get("eaglet_prompt_tokens_total", 0),
        "accept length (server)": round(m.get("eaglet_accepted_tokens_total", 0)
                                        / max(m.get("eaglet_verifies_total", 0), 1), 3),
    }
    from eaglet.bench.prompts import load_prompts

    prompts = [p.messages for p in load_prompts(cfg["prompts"], cfg["limit"])]
    engine = load_engine(ServeConfig(TargetOptions(args.target, max_context=args.max_context), args.draft))
    tok = engine.target.tokenizer
    params = SamplingParams(max_new_tokens=cfg["max_tokens"])
    offline: dict[str, str] = {}
    same = 0
    with torch.inference_mode():
        for messages, r in zip(prompts, reqs):
            key = json.dumps(messages)
            if key not in offline:
                [done] = engine.generate([encode_chat(tok, messages)], params)
                offline[key] = tok.decode(done.tokens, skip_special_tokens=True)
            same += r["ok"] and r["text"] == offline[key]
    totals["greedy answers identical to offline"] = f"{same}/{len(reqs)}"
    print(json.dumps(totals, indent=1))


if __name__ == "__main__":
    main()
