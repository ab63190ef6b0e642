"""The eaglet command line: the only place that parses arguments, and the user manual (--help).

eaglet generate | bench | data regenerate | data capture | train | draft import | doctor | serve

Each option's type refuses a bad value while parsing; ``cli_checks.check`` then checks paths
and options that go together, all before a model loads; ``cli_options`` turns the arguments into
the typed options of ``options.py`` (where every default is written), and ``commands/`` runs them.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from eaglet import __version__, options
from eaglet.cli_args import add_engine_options, add_head_options, add_sampling, add_spec_options, add_target, add_tp
from eaglet.cli_checks import integer, nonempty, number, size_list, url
from eaglet.cli_train import add_training_parsers
from eaglet.doctor.config import DoctorConfig
from eaglet.errors import EXIT_INTERRUPTED, EXIT_USAGE, EagletError, internal_error

EXAMPLES = """\
examples:
  eaglet generate --prompt "Explain speculative decoding in two sentences."
  eaglet bench --limit 8 --methods plain,spec --out runs/bench
  eaglet data regenerate --data builtin --max-samples 2000 --out runs/answers.jsonl
  eaglet data capture --data runs/answers.jsonl --out runs/features
  eaglet train --data runs/answers.jsonl --features runs/features --out runs/draft
  eaglet train --regenerate --time-budget-min 30 --out runs/draft   (prompts to draft in one command)
  eaglet draft import SRC OUT --capture-ids 1,15,28 --convention sglang
  eaglet doctor --draft runs/draft/draft --json runs/doctor.json

`eaglet COMMAND --help` documents every option of a command, with its default.

exit status: 0 done; 1 a doctor check failed; 2 a usage error (one sentence names the
option and the fix); 70 an internal error (a bug: the traceback is written to a log
file); 130 interrupted (train, data regenerate and data capture save their progress
first; the same command resumes).
"""


class _Help(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default, unless its help already says what the default is (or there is none)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, argparse.SUPPRESS) or action.default is False:
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """A usage error is one line, not the usage block followed by the message."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _Help)
        if kwargs.get("description"):  # raw text keeps the examples' layout, so wrap the prose here
            kwargs["description"] = textwrap.fill(kwargs["description"], 100)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"eaglet: error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="eaglet", description="Train EAGLE-3 draft models for a target LLM and serve the target "
                     "with tree speculative decoding.", epilog=EXAMPLES)
    parser.add_argument("--version", action="version", version=f"eaglet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="generate text for one prompt (speculative when a draft is given)",
                       description="Chat-templated generation for one prompt, streamed to stdout; speculative "
                                   "with a draft, plain without.")
    add_target(g)
    add_sampling(g, options.GenerateOptions.sampling)
    add_tp(g)
    g.add_argument("--prompt", required=True, type=nonempty, help="the user message; the chat template is applied")
    g.add_argument("--draft", default=options.GenerateOptions.draft,
                   help="'default' (the target's shipped draft, if any), 'none' (plain decoding), or a draft directory")
    g.add_argument("--json", action="store_true", help="print one JSON object with the result on the last line")
    add_spec_options(g)
    add_engine_options(g)
    _add_bench_parser(sub)
    add_training_parsers(sub)
    _add_doctor_parser(sub)
    _add_serve_parser(sub)
    return parser


def _add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="side-by-side speed: plain, speculative, transformers generate, prompt lookup",
                       description="The same prompts through every method in one process; writes OUT/report.json "
                                   "and OUT/report.png and prints a table.")
    add_target(b)
    b.add_argument("--draft", default=options.BenchConfig.draft,
                   help="'default' (the target's shipped draft) or a draft directory")
    b.add_argument("--prompts", default=options.BenchConfig.prompts,
                   help="JSONL of OpenAI 'messages' or {'prompt': ...} lines, or 'builtin' (80 bench prompts); "
                        "several sets comma-separated (builtin,other.jsonl): each is batched on its own and "
                        "reported on its own too")
    b.add_argument("--limit", type=integer(1), default=None,
                   help="N prompts of each set, spread over its categories (default: all)")
    add_sampling(b, options.BenchConfig.sampling)
    b.add_argument("--batch-size", type=integer(1), default=options.BenchConfig.batch_size,
                   help="prompts decoded together (ours and hf)")
    b.add_argument("--methods", default=",".join(options.BENCH_METHODS),
                   help="comma-separated subset of %(default)s (default: all of them)")
    b.add_argument("--out", required=True,
                   help="directory for report.json and report.png: new, empty, or an earlier bench's")
    add_spec_options(b)
    add_engine_options(b)
    add_tp(b)
    b.add_argument("--endpoint", type=url, default=None,
                   help="measure a running OpenAI-compatible server at this URL instead (streamed chat completions; "
                        "only --prompts --limit --max-new-tokens --temperature --seed --out apply)")
    b.add_argument("--concurrency", type=integer(1), default=None, help="with --endpoint: requests in flight at most")
    b.add_argument("--request-rate", type=number(0, low_open=True), default=None,
                   help="with --endpoint: Poisson arrivals per second")
    b.add_argument("--model", default=None, help="with --endpoint: the model name (default: the first listed)")


def _add_doctor_parser(sub) -> None:
    d = sub.add_parser("doctor", help="check a draft against its target, training against serving, with evidence",
                       description="Checks that training and serving feed the draft the same features: contract, "
                                   "capture parity, capture-point search, offline vs online acceptance, engine "
                                   "settings, tensor parallelism. Exit status 1 when a check fails.")
    add_target(d)
    d.add_argument("--draft", default=DoctorConfig.draft,
                   help="a draft directory, or 'default' (the target's shipped draft)")
    d.add_argument("--prompts", default=DoctorConfig.prompts,
                   help="JSONL of chat prompts (OpenAI 'messages' or {'prompt': ...}), or 'builtin' (bench set)")
    d.add_argument("--num-prompts", type=integer(1), default=DoctorConfig.num_prompts,
                   help="prompts the target answers and the draft is scored on")
    d.add_argument("--max-new-tokens", type=integer(4), default=DoctorConfig.max_new_tokens,
                   help="tokens per answer the draft is scored on; the speculative run decodes the first "
                        f"{DoctorConfig.serve_tokens}")
    d.add_argument("--features", default=None, help="offline feature directory (`data capture`) to compare too")
    d.add_argument("--tp", type=integer(1), default=None, help="also compare the target at tp=N with tp=1")
    d.add_argument("--json", default=None, metavar="PATH", help="write the whole report as JSON to PATH")
    d.add_argument("--temperature", type=number(0), default=DoctorConfig.temperature,
                   help="sampling temperature to judge; 0 = greedy")
    d.add_argument("--top-p", type=number(0, 1, low_open=True), default=DoctorConfig.top_p,
                   help="nucleus sampling to judge; 1 = off")
    d.add_argument("--sample-top-k", "--top-k", dest="top_k", metavar="K", type=integer(0),
                   default=DoctorConfig.top_k,
                   help="sampling top-k to judge; 0 = off (not the draft tree's --tree-topk)")
    add_spec_options(d)
    add_head_options(d)


def _add_serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching (docs/serving.md)")
    add_target(s)
    s.add_argument("--draft", default=options.ServeConfig.draft,
                   help="'default' (the target's shipped draft, if any), 'none' (plain decoding), or a draft directory")
    s.add_argument("--host", default=options.ServeConfig.host, help="address to listen on")
    s.add_argument("--port", type=integer(1), default=options.ServeConfig.port, help="TCP port to listen on")
    s.add_argument("--max-batch", type=integer(1), default=options.ServeConfig.max_batch,
                   help=f"rows decoded together at most (the running batch; default {options.DEFAULT_MAX_BATCH})")
    s.add_argument("--batch-sizes", type=size_list, default=options.ServeConfig.batch_sizes, metavar="SIZES",
                   help="the batch sizes a batch may open with, e.g. 1,16,64 (default: the powers of two below "
                        "--max-batch, and --max-batch); each builds its own CUDA graphs")
    s.add_argument("--warm-up", action=argparse.BooleanOptionalAction, default=options.ServeConfig.warm_up,
                   help="build every batch size's compiled step before listening (default: on with CUDA graphs)")
    s.add_argument("--max-queue", type=integer(1), default=options.ServeConfig.max_queue,
                   help="requests waiting for a row; more are answered 429")
    s.add_argument("--grace", type=number(0), default=options.ServeConfig.grace_s,
                   help="seconds running requests get after SIGTERM")
    s.add_argument("--stream-interval", type=integer(1), default=options.ServeConfig.stream_interval, metavar="N",
                   help="a streamed answer's tokens go out once N have gathered (the first at once, the last at "
                        "the end): fewer, larger chunks leave the engine's thread more of the GIL "
                        "(docs/serving.md)")
    s.add_argument("--overlap-handoff", action=argparse.BooleanOptionalAction, default=False,
                   help="hand a step's tokens to the HTTP thread once the next step is queued on the GPU, so "
                        "sending them overlaps its work (experiment, off: no gain measured on the H200)")
    add_tp(s)
    add_spec_options(s)
    add_engine_options(s)


def main(argv: list[str] | None = None) -> int:
    from eaglet.parallel.launch import end_torchrun_rank

    return end_torchrun_rank(_run(argv))


def _run(argv: list[str] | None) -> int:
    from eaglet.cli_checks import check
    from eaglet.cli_options import OPTIONS, command_name
    from eaglet.cli_train import apply_recipe
    from eaglet.commands import COMMANDS
    from eaglet.interrupt import Interrupted

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error argparse has already printed
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        if getattr(args, "recipe", None):
            apply_recipe(args)
        check(args)  # every path and every option that goes with another, before a model loads
        name = command_name(args)
        return COMMANDS[name](OPTIONS[name](args))
    except Interrupted as e:
        print(f"eaglet: interrupted: {e}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except EagletError as e:
        print(f"eaglet: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("eaglet: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001  (every other exception is a bug; it still gets a clear sentence)
        from eaglet.loading.target import cache_root

        return internal_error(e, cache_root() / "logs")


if __name__ == "__main__":
    sys.exit(main())
