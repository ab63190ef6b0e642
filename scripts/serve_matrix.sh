#!/usr/bin/env bash
# The serving numbers of docs/performance.md: `eaglet serve` measured from the client side by
# `eaglet bench --endpoint` at each concurrency, speculation on (the shipped draft) and off,
# then the offline `eaglet bench` at batch 1 on the same prompts (the server at concurrency 1
# should be within 10% of it). Prints one table at the end, with the mean time to the first token as
# the client saw it beside the server's own (its /metrics histogram, scraped after each level): the
# difference is what HTTP, templating and delivery add.
#
#   scripts/serve_matrix.sh [TARGET] [OUTDIR]            (defaults: smollm2-135m runs/serve)
#
# Env: PROMPTS (default builtin), N requests per run (64), MAX_NEW tokens (256), LEVELS of
# concurrency ("1 16 64"), SIZES the server's batch sizes (1,16,64: each builds its own graphs,
# all before the server listens), PORT (8123), SERVE_ARGS (extra serve options),
# RUN_TIMEOUT seconds per bench run (300), DRAFTS the servers to run ("default none"), SERVE the server
# command ("python3 -m eaglet.cli serve"; .dev-style wrappers that time the request path take the
# same arguments), OFFLINE=0 to skip
# the offline bench. A machine that limits each command's time runs it in pieces into one OUTDIR
# (DRAFTS=default OFFLINE=0, then DRAFTS=none OFFLINE=0, then DRAFTS= ); the last prints the whole table.
set -u
target=${1:-smollm2-135m}
out=${2:-runs/serve}
prompts=${PROMPTS:-builtin}
n=${N:-64}
max_new=${MAX_NEW:-256}
port=${PORT:-8123}
mkdir -p "$out"

up() {  # $1: the server's pid; fails at once when the server exits (a missing module, a bad flag)
  python3 - "$port" "$1" <<'EOF'
import sys, time, httpx
from pathlib import Path
def alive(pid):
    try:  # a server that exited may linger unreaped as a zombie: state Z
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
deadline = time.monotonic() + 1200
while time.monotonic() < deadline and alive(sys.argv[2]):
    try:
        if httpx.get(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).status_code == 200:
            sys.exit(0)
    except httpx.TransportError:
        pass
    time.sleep(1)
sys.exit(1)
EOF
}

for draft in ${DRAFTS-default none}; do
  echo "== serve --draft $draft"
  # shellcheck disable=SC2086
  ${SERVE:-python3 -m eaglet.cli serve} --target "$target" --draft "$draft" --port "$port" --batch-sizes "${SIZES:-1,16,64}" \
    --warm-up ${SERVE_ARGS:-} >"$out/serve-$draft.log" 2>&1 &
  server=$!
  if ! up "$server"; then
    echo "the server did not come up"; tail -n 20 "$out/serve-$draft.log"; kill "$server" 2>/dev/null; exit 1
  fi
  grep "ready\|serving" "$out/serve-$draft.log"
  for c in ${LEVELS:-1 16 64}; do
    timeout "${RUN_TIMEOUT:-300}" python3 -m eaglet.cli bench --endpoint "http://127.0.0.1:$port" --prompts "$prompts" \
      --limit "$n" --max-new-tokens "$max_new" --concurrency "$c" --out "$out/$draft-c$c" >"$out/$draft-c$c.log" 2>&1
    echo "concurrency $c: exit $?"
    # the server's own counters after each level (cumulative): its arrival-to-first-token beside the client's
    python3 -c 'import sys, httpx; print(httpx.get(sys.argv[1], timeout=10).text)' \
      "http://127.0.0.1:$port/metrics" >"$out/$draft-c$c.metrics" 2>/dev/null
  done
  kill -TERM "$server"
  wait "$server"
  grep -i "tree\|switch" "$out/serve-$draft.log" | tail -n 12
done

if [ "${OFFLINE:-1}" = 1 ]; then
  echo "== offline bench, batch 1"
  timeout "${RUN_TIMEOUT:-300}" python3 -m eaglet.cli bench --target "$target" --prompts "$prompts" --limit "$n" \
    --max-new-tokens "$max_new" --batch-size 1 --methods plain,spec --out "$out/offline" >"$out/offline.log" 2>&1
  echo "exit $?"
fi

python3 - "$out" ${LEVELS:-1 16 64} <<'EOF'
import json, sys
from pathlib import Path
out, levels = Path(sys.argv[1]), sys.argv[2:]
def load(p):
    try:
        return json.loads((p / "report.json").read_text())
    except (OSError, ValueError):
        return None
def mean_ttft(r):
    got = [q["ttft"] for q in r.get("requests", []) if q.get("ttft") is not None]
    return sum(got) / len(got) if got else None
def ttft_totals(d, level):
    """(sum, count) of the server's arrival-to-first-token histogram scraped after ``level``, or None."""
    try:
        lines = (out / f"{d}-c{level}.metrics").read_text().splitlines()
    except OSError:
        return None
    name = "eaglet_time_to_first_token_seconds"
    got = {k: float(x.split()[1]) for x in lines for k in ("_sum", "_count") if x.startswith(f"{name}{k} ")}
    return (got["_sum"], got["_count"]) if len(got) == 2 else None
def server_ttft(d, c):
    """Mean arrival-to-first-token inside the server over level c's requests (the histogram is cumulative:
    after c, less after the level before), or None without the scrapes."""
    i = levels.index(c)
    now, before = ttft_totals(d, c), ttft_totals(d, levels[i - 1]) if i else (0.0, 0.0)
    if now is None or before is None or now[1] <= before[1]:
        return None
    return (now[0] - before[0]) / (now[1] - before[1])
print(f"{'run':<14}{'tok/s':>9}{'spec/plain':>11}{'ttft p50':>10}{'ttft p99':>10}{'itl p50':>9}{'itl p99':>9}{'failed':>8}"
      f"{'ttft mean':>10}{'in server':>10}")
for c in levels:
    got = {d: load(out / f"{d}-c{c}") for d in ("default", "none")}
    for d, name in (("none", "plain"), ("default", "spec")):
        r = got[d]
        if r is None:
            print(f"{name + ' c' + c:<14}{'missing':>9}")
            continue
        s = r["summary"]
        ratio = ""
        if d == "default" and got["none"]:
            ratio = f"{s['output_tok_per_s'] / got['none']['summary']['output_tok_per_s']:.2f}x"
        ms = lambda x: f"{1000 * x:.1f}" if x is not None else "-"
        print(f"{name + ' c' + c:<14}{s['output_tok_per_s']:>9.1f}{ratio:>11}{ms(s['ttft_s']['median']):>10}"
              f"{ms(s['ttft_s']['p99']):>10}{ms(s['itl_s']['median']):>9}{ms(s['itl_s']['p99']):>9}{s['failed']:>8}"
              f"{ms(mean_ttft(r)):>10}{ms(server_ttft(d, c)):>10}")
off = load(out / "offline")
if off:
    m = off["methods"]
    print("offline batch 1: " + ", ".join(f"{k} {v['tokens_per_s']:.1f} tok/s" for k, v in m.items())
          + f"; spec/plain {off['speedup'].get('spec_over_plain')}")
    c1 = load(out / "default-c1")
    if c1 and m.get("spec", {}).get("tokens_per_s"):
        print(f"server spec c1 / offline spec b1: {c1['summary']['output_tok_per_s'] / m['spec']['tokens_per_s']:.2f}")
print("(ms; tok/s = completion tokens over the run's wall time; ttft mean: the client's, in server: from the "
      "request's arrival, tokenized, to its first token, the server's histogram)")
EOF
