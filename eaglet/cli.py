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
from eaglet.cli_checks import answer_list, device, integer, nonempty, number, point_list, size_list, url
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


def _add_target(p: argparse.ArgumentParser, context: bool = True) -> None:
    p.add_argument("--target", default=options.DEFAULT_TARGET,
                   help="the target model: an embedded name (smollm2-135m), a Hugging Face model directory "
                        "(config.json, safetensors, tokenizer) or a .gguf file")
    p.add_argument("--device", type=device, default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="the target's dtype (default: float32 on CPU, bfloat16 on CUDA)")
    if context:
        p.add_argument("--max-context", type=integer(2), default=None,
                       help="KV-cache size in tokens, prompt and answer together (default: the model's window, "
                            "capped at 4096)")


def _add_sampling(p: argparse.ArgumentParser, defaults: options.SamplingParams) -> None:
    seed = defaults.seed
    p.add_argument("--max-new-tokens", type=integer(1), default=defaults.max_new_tokens,
                   help="tokens generated per answer at most")
    p.add_argument("--temperature", type=number(0), default=defaults.temperature,
                   help="sampling temperature; 0 = greedy")
    p.add_argument("--top-p", type=number(0, 1, low_open=True), default=defaults.top_p,
                   help="nucleus sampling: keep the most likely tokens up to this probability mass; 1 = off")
    p.add_argument("--sample-top-k", "--top-k", dest="top_k", metavar="K", type=integer(0), default=defaults.top_k,
                   help="sampling: keep the k most likely tokens; 0 = off (not the draft tree's --tree-topk)")
    p.add_argument("--seed", type=int, default=seed,
                   help="random seed of sampling" + (" (default: none, a fresh draw each run)" if seed is None else ""))


def _add_tp(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=integer(1), default=1,
                   help="tensor-parallel ranks: shard the target over N processes, one per GPU (gloo on CPU); "
                        "eaglet starts them, or joins those torchrun started")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="eaglet", description="Train EAGLE-3 draft models for a target LLM and serve the target "
                     "with tree speculative decoding.", epilog=EXAMPLES)
    parser.add_argument("--version", action="version", version=f"eaglet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="generate text for one prompt (speculative when a draft is given)",
                       description="Chat-templated generation for one prompt, streamed to stdout; speculative "
                                   "with a draft, plain without.")
    _add_target(g)
    _add_sampling(g, options.GenerateOptions.sampling)
    _add_tp(g)
    g.add_argument("--prompt", required=True, type=nonempty, help="the user message; the chat template is applied")
    g.add_argument("--draft", default=options.GenerateOptions.draft,
                   help="'default' (the target's shipped draft, if any), 'none' (plain decoding), or a draft directory")
    g.add_argument("--json", action="store_true", help="print one JSON object with the result on the last line")
    _add_spec_options(g)
    _add_engine_options(g)
    _add_bench_parser(sub)
    _add_training_parsers(sub)
    _add_doctor_parser(sub)
    _add_serve_parser(sub)
    return parser


def _add_spec_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-steps", type=integer(1), default=None,
                   help="draft tree: draft steps = tree depth (default: automatic)")
    p.add_argument("--tree-topk", "--topk", dest="topk", metavar="K", type=integer(1), default=None,
                   help="draft tree: children per expanded node (default: automatic; not sampling's --sample-top-k)")
    p.add_argument("--num-draft-tokens", type=integer(2), default=None,
                   help="draft tree: nodes verified per step, root included (default: automatic); "
                        "set all three tree options or none")


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="fuse the speculative engine's iteration with torch.compile before graph capture "
                        "(default: on with CUDA graphs; compiles once per batch size and tree; docs/speculative.md)")
    p.add_argument("--policy", choices=("auto", "off"), default="auto",
                   help="'auto': measure costs and acceptance, step down to smaller trees or plain decoding "
                        "when speculation is slower; 'off': keep the tree whatever it costs")


def _add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="side-by-side speed: plain, speculative, transformers generate, prompt lookup",
                       description="The same prompts through every method in one process; writes OUT/report.json "
                                   "and OUT/report.png and prints a table.")
    _add_target(b)
    b.add_argument("--draft", default=options.BenchConfig.draft,
                   help="'default' (the target's shipped draft) or a draft directory")
    b.add_argument("--prompts", default=options.BenchConfig.prompts,
                   help="JSONL of OpenAI 'messages' or {'prompt': ...} lines, or 'builtin' (80 bench prompts); "
                        "several sets comma-separated (builtin,other.jsonl): each is batched on its own and "
                        "reported on its own too")
    b.add_argument("--limit", type=integer(1), default=None, help="the first N prompts of each set (default: all)")
    _add_sampling(b, options.BenchConfig.sampling)
    b.add_argument("--batch-size", type=integer(1), default=options.BenchConfig.batch_size,
                   help="prompts decoded together (ours and hf)")
    b.add_argument("--methods", default=",".join(options.BENCH_METHODS),
                   help="comma-separated subset of %(default)s (default: all of them)")
    b.add_argument("--out", required=True,
                   help="directory for report.json and report.png: new, empty, or an earlier bench's")
    _add_spec_options(b)
    _add_engine_options(b)
    _add_tp(b)
    b.add_argument("--endpoint", type=url, default=None,
                   help="measure a running OpenAI-compatible server at this URL instead (streamed chat completions; "
                        "only --prompts --limit --max-new-tokens --temperature --seed --out apply)")
    b.add_argument("--concurrency", type=integer(1), default=None, help="with --endpoint: requests in flight at most")
    b.add_argument("--request-rate", type=number(0, low_open=True), default=None,
                   help="with --endpoint: Poisson arrivals per second")
    b.add_argument("--model", default=None, help="with --endpoint: the model name (default: the first listed)")


def _add_regen_options(p: argparse.ArgumentParser, batch_flag: str) -> None:
    rc = options.RegenConfig
    p.add_argument(batch_flag, dest="regen_batch_size", metavar="N", type=integer(1), default=rc.batch_size,
                   help="rows decoded together (a finished row takes the next prompt at once)")
    p.add_argument("--max-new-tokens", type=integer(1), default=rc.max_new_tokens, help="tokens per answer at most")
    p.add_argument("--answers", type=answer_list, default=rc.answers, metavar="SETTINGS",
                   help="answers per prompt, comma-separated: 'greedy' and sampling temperatures, e.g. "
                        "greedy,0.7,1.0 (one record each, ids <id> and <id>~t0.7; validation prompts are "
                        "answered greedily only) (default: greedy)")
    p.add_argument("--top-p", type=number(0, 1, low_open=True), default=rc.top_p, help="nucleus sampling; 1 = off")
    p.add_argument("--max-prompt-tokens", type=integer(1), default=rc.max_prompt_tokens,
                   help="longer prompts are skipped and counted")
    p.add_argument("--max-samples", type=integer(1), default=rc.max_samples,
                   help="regenerate at most this many training prompts, a seeded sample (default: all)")
    p.add_argument("--max-val-samples", type=integer(0), default=rc.max_val_samples,
                   help="and at most this many validation prompts (default: all)")
    p.add_argument("--self-prompts", type=integer(0), default=rc.self_prompts, metavar="N",
                   help="also have the target write N user prompts itself from the chat template's user prefix "
                        "(Magpie; source 'self', 5%% held out for validation as 'self-heldout'; cut, short and "
                        "duplicate ones are dropped)")
    p.add_argument("--follow-ups", type=number(0, 1), default=rc.follow_ups, metavar="FRACTION",
                   help="give this fraction of the greedily answered conversations a second user turn the "
                        "target writes, and answer it (multi-turn data)")


def _add_training_parsers(sub) -> None:
    data = sub.add_parser("data", help="training data: regenerate answers with the target, capture features",
                          description="Training data: `regenerate` has the target answer prompts, `capture` stores "
                                      "its hidden states as offline features.")
    dsub = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    r = dsub.add_parser("regenerate", help="the target answers the prompts itself (self-distillation); resumable",
                        description="The target answers the prompts itself (self-distillation). Answers are "
                                    "appended to OUT as they finish; the settings are recorded in OUT.meta.json, and "
                                    "a rerun with the same settings resumes where the last one stopped.")
    _add_target(r, context=False)
    r.add_argument("--data", required=True, help="'builtin' (the prompt corpus) or JSONL files, comma-separated")
    r.add_argument("--split", choices=["train", "val", "all"], default="all", help="which records to answer")
    r.add_argument("--out", required=True, help="output JSONL; finished records are appended, a rerun resumes")
    r.add_argument("--restart", action="store_true",
                   help="discard OUT and its recorded settings and start over (e.g. with other generation settings)")
    _add_regen_options(r, "--batch-size")
    r.add_argument("--seed", type=int, default=options.RegenConfig.seed,
                   help="seed of the prompt sample, batch order and sampling")
    r.add_argument("--time-budget-min", type=number(0, low_open=True), default=None,
                   help="admit no prompt after this many minutes; the answers in progress finish (default: no limit)")
    r.add_argument("--endpoint", type=url, default=None, metavar="URL",
                   help="have a running OpenAI-compatible server (SGLang, vLLM, eaglet serve) answer instead; "
                        "--target then gives only the tokenizer (docs/training.md)")
    r.add_argument("--model", default=None, help="with --endpoint: the served model's name (default: the first listed)")
    r.add_argument("--concurrency", type=integer(1), default=None,
                   help=f"with --endpoint: requests in flight at most (default: {options.REGEN_CONCURRENCY})")

    c = dsub.add_parser("capture", help="offline features: captured points and final hidden states, sharded",
                        description="Offline features for `train --features`: the captured points and final "
                                    "hidden states of every answered conversation, in safetensors shards; a rerun "
                                    "completes an interrupted capture.")
    _add_target(c, context=False)
    c.add_argument("--data", required=True, help="JSONL with assistant answers (e.g. from `data regenerate`)")
    c.add_argument("--split", choices=["train", "val", "all"], default="all", help="which records to capture")
    c.add_argument("--out", required=True, help="feature directory: new, empty, or an earlier capture (it resumes)")
    c.add_argument("--capture", type=point_list, default=None,
                   help="residual-stream points in eaglet's convention, e.g. 2,15,27 "
                        "(default: EAGLE-3's [2, N//2, N-3])")
    c.add_argument("--shard-samples", type=integer(1), default=options.CaptureOptions.shard_samples,
                   help="conversations per shard")
    c.add_argument("--batch-tokens", type=integer(1), default=options.CaptureOptions.batch_tokens,
                   help="padded tokens per target forward")
    c.add_argument("--max-len", type=integer(8), default=None,
                   help="tokens per conversation (default: 2048 or the window)")
    c.add_argument("--feature-dtype", choices=["bfloat16", "float32"], default=options.CaptureOptions.feature_dtype,
                   help="stored precision")
    _add_tp(c)
    _add_train_parser(sub)
    d = sub.add_parser("draft", help="draft checkpoints: import another tool's EAGLE-3 draft")
    dd = d.add_subparsers(dest="draft_command", required=True, metavar="SUBCOMMAND")
    i = dd.add_parser("import", help="re-write an SGLang/SpecForge/vLLM EAGLE-3 draft as an eaglet draft",
                      description="Re-write an SGLang/SpecForge/vLLM EAGLE-3 draft as an eaglet draft with "
                                  "explicit capture points, checked against the target.")
    i.add_argument("src", metavar="SRC", help="the draft directory to import (config.json and safetensors)")
    i.add_argument("out", metavar="OUT", help="where the eaglet draft is written: a new or empty directory")
    i.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT (atomically, once written)")
    _add_target(i, context=False)
    i.add_argument("--capture-ids", type=point_list, default=None,
                   help="the draft's capture layer ids, counted as --convention says (default: from its config)")
    i.add_argument("--convention", choices=["eaglet", "vllm", "sglang", "specforge"], default=None,
                   help="how --capture-ids count: eaglet/vllm name points, sglang/specforge 'output of layer i' "
                        "(= eaglet point i+1)")


def _add_train_parser(sub) -> None:
    t = sub.add_parser("train", help="train an EAGLE-3 draft (training-time test); resumes from OUT/checkpoint",
                       description="Train an EAGLE-3 draft with training-time test, validate it, and export it "
                                   "to OUT/draft. A rerun with the same OUT resumes from OUT/checkpoint.")
    tc = options.TrainConfig
    _add_target(t, context=False)
    t.add_argument("--data", default=options.TrainOptions.data,
                   help="JSONL files with answers, comma-separated; or prompts (e.g. 'builtin') with --regenerate")
    t.add_argument("--out", required=True, help="run directory: logs, checkpoint/, draft/ (the export), acc.png")
    t.add_argument("--regenerate", action="store_true", help="first have the target answer --data's prompts")
    _add_regen_options(t, "--regen-batch-size")
    t.add_argument("--regen-budget-min", type=number(0, low_open=True), default=None,
                   help="time for regeneration (default: while the time left still trains --epochs passes "
                        "over the data so far; docs/training.md)")
    t.add_argument("--train-tokens-per-s", type=number(0, low_open=True), default=None,
                   help="padded training tokens per second, for the budget split (default: 107000, measured "
                        "with SmolLM2 on one H200, validation included)")
    t.add_argument("--features", default=None,
                   help="offline feature directory (`data capture`) instead of online (default: online)")
    t.add_argument("--val-features", default=None, help="offline features for validation (default: online)")
    t.add_argument("--val-fraction", type=number(0, 1, high_open=True), default=options.TrainOptions.val_fraction,
                   help="held out when records carry no split")
    t.add_argument("--time-budget-min", type=number(0, low_open=True), default=None,
                   help="whole-command budget; training stops in time to validate and export (default: none)")
    t.add_argument("--ttt-steps", type=integer(1), default=tc.ttt_steps,
                   help="draft steps unrolled in training-time test")
    t.add_argument("--decay", type=number(0, 1, low_open=True), default=tc.decay, help="loss weight decay**j of step j")
    t.add_argument("--aux-norm", action=argparse.BooleanOptionalAction, default=tc.aux_norm,
                   help="RMS-normalise each captured point before fc (a learned weight per point, stored in the "
                        "draft and applied in serving too); --no-aux-norm for a draft other engines can load")
    t.add_argument("--aux-noise", type=number(0), default=tc.aux_noise, metavar="SIGMA",
                   help="training only: add uniform noise in [-SIGMA, SIGMA] to the captured points; 0 = off")
    t.add_argument("--target-turns-only", action="store_true",
                   help="loss only on assistant turns the target wrote itself, not on earlier turns of the data")
    t.add_argument("--lr", type=number(0, low_open=True), default=tc.lr, help="peak learning rate (AdamW)")
    t.add_argument("--min-lr-ratio", type=number(0, 1), default=tc.min_lr_ratio, help="the cosine ends at lr * this")
    t.add_argument("--warmup-steps", type=integer(0), default=tc.warmup_steps, help="linear warm-up steps")
    t.add_argument("--weight-decay", type=number(0), default=tc.weight_decay, help="AdamW weight decay")
    t.add_argument("--grad-clip", type=number(0, low_open=True), default=tc.grad_clip, help="gradient-norm clip")
    t.add_argument("--epochs", type=integer(1), default=tc.epochs, help="passes over the training data")
    t.add_argument("--max-steps", type=integer(1), default=tc.max_steps,
                   help="stop after this many steps (default: epochs)")
    t.add_argument("--batch-tokens", type=integer(16), default=tc.batch_tokens, help="padded tokens per batch and rank")
    t.add_argument("--max-len", type=integer(8), default=tc.max_len,
                   help="tokens per conversation (default: 2048 or the window)")
    t.add_argument("--draft-vocab-size", type=integer(1), default=tc.draft_vocab_size,
                   help="draft vocabulary (default: the largest with a 16 MiB bf16 LM head)")
    t.add_argument("--capture", type=point_list, default=tc.capture_points,
                   help="residual-stream points in eaglet's convention (default: EAGLE-3's [2, N//2, N-3])")
    t.add_argument("--save-every", type=integer(1), default=tc.save_every, help="checkpoint every N steps")
    t.add_argument("--val-every", type=integer(1), default=tc.val_every, help="validate every N steps")
    t.add_argument("--seed", type=int, default=tc.seed, help="seed of the draft's initialisation and the batch order "
                   "(with --regenerate also of the prompt sample and sampling)")
    t.add_argument("--no-autocast", action="store_true", help="no bf16 autocast on CUDA")
    t.add_argument("--tensorboard", action="store_true", help="also log to OUT/tensorboard (needs tensorboard)")
    _add_tp(t)


def _add_doctor_parser(sub) -> None:
    d = sub.add_parser("doctor", help="check a draft against its target, training against serving, with evidence",
                       description="Checks that training and serving feed the draft the same features: contract, "
                                   "capture parity, capture-point search, offline vs online acceptance, engine "
                                   "settings, tensor parallelism. Exit status 1 when a check fails.")
    _add_target(d)
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
    _add_spec_options(d)


def _add_serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching (docs/serving.md)")
    _add_target(s)
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
    _add_tp(s)
    _add_spec_options(s)
    _add_engine_options(s)


def main(argv: list[str] | None = None) -> int:
    from eaglet.cli_checks import check
    from eaglet.cli_options import OPTIONS, command_name
    from eaglet.commands import COMMANDS
    from eaglet.interrupt import Interrupted

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error argparse has already printed
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
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
