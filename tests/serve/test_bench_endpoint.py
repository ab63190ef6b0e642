"""`eaglet bench --endpoint`: a client load test against a running server; its counts agree with the server's, and
what a broken server sends (an error event, a stream cut off) counts as failed."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

from eaglet.bench import endpoint
from eaglet.cli import main
from eaglet.options import EndpointBenchConfig


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


def _canned_server(answers: list[bytes]) -> tuple[str, threading.Thread]:
    """A server on 127.0.0.1 that reads one request per connection and writes the next canned answer, then
    closes the connection -> (its URL, its thread)."""
    sock = socket.create_server(("127.0.0.1", 0))

    def serve():
        with sock:
            for answer in answers:
                conn, _ = sock.accept()
                with conn:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    head, body = data.split(b"\r\n\r\n", 1)
                    length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n")
                                  if x.lower().startswith(b"content-length"))
                    while len(body) < length:
                        body += conn.recv(65536)
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", thread


def test_endpoint_bench_counts_error_events_and_broken_streams(tmp_path):
    content = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
    error_event = b'data: {"error": {"message": "the engine failed"}}\n\n'
    answers = [
        # an error event inside a 200 stream
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
        % (len(content + error_event), content + error_event),
        # a chunked stream cut off after its first chunk (no terminating chunk)
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n"
        % (len(content), content),
    ]
    url, thread = _canned_server(answers)
    cfg = EndpointBenchConfig(endpoint=url, out=str(tmp_path), concurrency=1)
    results, _ = asyncio.run(endpoint._run(cfg, [[{"role": "user", "content": "a"}]] * 2, "m"))
    thread.join(10)
    assert [r.ok for r in results] == [False, False]
    assert results[0].error == "the engine failed"
    assert "ClientPayloadError" in results[1].error or "ServerDisconnected" in results[1].error, results[1].error
    assert endpoint.summarize(results, 1.0)["failed"] == 2
