"""`eaglet bench --endpoint`: a client load test against a running server; its counts agree with the server's."""

from __future__ import annotations

import json

from eaglet.cli import main


def test_endpoint_bench_reports_what_the_server_sent(served, tmp_path):
    prompts = tmp_path / "p.jsonl"
    lines = [{"prompt": f"the {w} ran"} for w in ("cat", "dog", "fox", "mat", "big", "red")]
    lines.append({"prompt": "to " * 300})  # longer than the context: one failed request
    prompts.write_text("\n".join(json.dumps(x) for x in lines))
    before = served.metric("eaglet_generation_tokens_total")
    out = tmp_path / "report"
    rc = main(["bench", "--endpoint", served.url, "--prompts", str(prompts), "--concurrency", "3",
               "--request-rate", "50", "--max-new-tokens", "8", "--out", str(out)])
    report = json.loads((out / "report.json").read_text())
    s = report["summary"]
    assert rc == 1 and s["requests"] == 7 and s["failed"] == 1 and "context holds" in s["errors"][0]
    assert s["completion_tokens"] == 6 * 8 == served.metric("eaglet_generation_tokens_total") - before
    assert s["output_tok_per_s"] > 0 and s["ttft_s"]["median"] <= s["ttft_s"]["p99"]
    assert s["itl_s"]["median"] is not None and (out / "report.png").stat().st_size > 0
    assert report["config"]["model"] == served.model and report["requests"][0]["ok"]
