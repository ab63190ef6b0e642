"""The options of the commands that make a draft: data regenerate, data capture, train, draft import."""

from __future__ import annotations

import argparse

from eaglet import train_options
from eaglet.cli_args import add_target, add_tp
from eaglet.cli_checks import answer_list, integer, number, point_list, url
from eaglet.errors import EagletError


class Given(argparse.Action):
    """Store the value and note the flag as given (``args.given``), so a --recipe leaves it alone however it
    was spelt (argparse resolves abbreviations before this runs)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = getattr(namespace, "given", set()) | {self.dest}


def apply_recipe(args: argparse.Namespace) -> None:
    """``train --recipe NAME``: the recipe's value for each of its flags the command line did not give."""
    if not args.regenerate:
        raise EagletError(f"--recipe {args.recipe} sets the data --regenerate writes and the epochs over it; add "
                          "--regenerate, or leave --recipe out")
    given = getattr(args, "given", set())
    for dest, value in train_options.RECIPES[args.recipe].items():
        if dest not in given:
            setattr(args, dest, value)
    if not args.self_prompts and "self_prompt_openers" not in given:  # --self-prompts 0: the recipe's openers go too
        args.self_prompt_openers = 0.0


def _add_regen_options(p: argparse.ArgumentParser, batch_flag: str, endpoint: bool) -> None:
    """The regeneration options of ``data regenerate`` and ``train --regenerate``; ``endpoint``: the command
    also answers through ``--endpoint``."""
    rc = train_options.RegenConfig
    p.add_argument(batch_flag, dest="regen_batch_size", metavar="N", type=integer(1), default=rc.batch_size,
                   help="rows decoded together (a finished row takes the next prompt at once; default: on a GPU "
                        "the most, up to 2048, whose KV cache fits 60%% of the free memory; 256 on a CPU"
                        + (" or through --endpoint)" if endpoint else ")"))
    p.add_argument("--max-new-tokens", action=Given, type=integer(1), default=rc.max_new_tokens,
                   help="tokens per answer at most")
    p.add_argument("--answers", action=Given, type=answer_list, default=rc.answers, metavar="SETTINGS",
                   help="answers per prompt, comma-separated: 'greedy' and sampling temperatures, e.g. "
                        "greedy,0.7,1.0 (one record each, ids <id> and <id>~t0.7; validation prompts are "
                        "answered greedily only) (default: greedy)")
    p.add_argument("--top-p", type=number(0, 1, low_open=True), default=rc.top_p, help="nucleus sampling; 1 = off")
    p.add_argument("--max-prompt-tokens", type=integer(1), default=rc.max_prompt_tokens,
                   help="longer prompts are skipped and counted")
    p.add_argument("--max-samples", action=Given, type=integer(1), default=rc.max_samples,
                   help="regenerate at most this many training prompts, a seeded sample (default: all)")
    p.add_argument("--max-val-samples", type=integer(0), default=rc.max_val_samples,
                   help="and at most this many validation prompts (default: all)")
    p.add_argument("--self-prompts", action=Given, type=integer(0), default=rc.self_prompts, metavar="N",
                   help="also have the target write N user prompts itself from the chat template's user prefix "
                        "(Magpie; source 'self', 5%% held out for validation as 'self-heldout'; cut, short and "
                        "duplicate ones are dropped)")
    p.add_argument("--self-prompt-openers", action=Given, type=number(0, 1), default=rc.self_prompt_openers,
                   metavar="FRACTION",
                   help="start this fraction of the --self-prompts with an opener such as 'Pretend you are' or "
                        "'Write a poem about' and let the target write the rest: requests of kinds it seldom "
                        "writes unprompted (source 'self-steered')")
    p.add_argument("--follow-ups", action=Given, type=number(0, 1), default=rc.follow_ups, metavar="FRACTION",
                   help="give this fraction of the greedily answered conversations a second user turn the "
                        "target writes, and answer it (multi-turn data)")


def add_training_parsers(sub) -> None:
    data = sub.add_parser("data", help="training data: regenerate answers with the target, capture features",
                          description="Training data: `regenerate` has the target answer prompts, `capture` stores "
                                      "its hidden states as offline features.")
    dsub = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    r = dsub.add_parser("regenerate", help="the target answers the prompts itself (self-distillation); resumable",
                        description="The target answers the prompts itself (self-distillation). Answers are "
                                    "appended to OUT as they finish; the settings are recorded in OUT.meta.json, and "
                                    "a rerun with the same settings resumes where the last one stopped.")
    add_target(r, context=False)
    r.add_argument("--data", required=True, help="'builtin' (the prompt corpus) or JSONL files, comma-separated")
    r.add_argument("--split", choices=["train", "val", "all"], default="all", help="which records to answer")
    r.add_argument("--out", required=True, help="output JSONL; finished records are appended, a rerun resumes")
    r.add_argument("--restart", action="store_true",
                   help="discard OUT and its recorded settings and start over (e.g. with other generation settings)")
    _add_regen_options(r, "--batch-size", endpoint=True)
    r.add_argument("--seed", type=int, default=train_options.RegenConfig.seed,
                   help="seed of the prompt sample, batch order and sampling")
    r.add_argument("--time-budget-min", type=number(0, low_open=True), default=None,
                   help="admit no prompt after this many minutes; the answers in progress finish (default: no limit)")
    r.add_argument("--endpoint", type=url, default=None, metavar="URL",
                   help="have a running OpenAI-compatible server (SGLang, vLLM, eaglet serve) answer instead; "
                        "--target then gives only the tokenizer (docs/training.md)")
    r.add_argument("--model", default=None, help="with --endpoint: the served model's name (default: the first listed)")
    r.add_argument("--concurrency", type=integer(1), default=None,
                   help=f"with --endpoint: requests in flight at most (default: {train_options.REGEN_CONCURRENCY})")

    c = dsub.add_parser("capture", help="offline features: captured points and final hidden states, sharded",
                        description="Offline features for `train --features`: the captured points and final "
                                    "hidden states of every answered conversation, in safetensors shards; a rerun "
                                    "completes an interrupted capture.")
    add_target(c, context=False)
    c.add_argument("--data", required=True, help="JSONL with assistant answers (e.g. from `data regenerate`)")
    c.add_argument("--split", choices=["train", "val", "all"], default="all", help="which records to capture")
    c.add_argument("--out", required=True, help="feature directory: new, empty, or an earlier capture (it resumes)")
    c.add_argument("--capture", type=point_list, default=None,
                   help="residual-stream points in eaglet's convention, e.g. 2,15,27 "
                        "(default: EAGLE-3's [2, N//2, N-3])")
    c.add_argument("--shard-samples", type=integer(1), default=train_options.CaptureOptions.shard_samples,
                   help="conversations per shard")
    c.add_argument("--batch-tokens", type=integer(1), default=train_options.CaptureOptions.batch_tokens,
                   help="padded tokens per target forward")
    c.add_argument("--max-len", type=integer(8), default=None,
                   help="tokens per conversation (default: 2048 or the window)")
    c.add_argument("--feature-dtype", choices=["bfloat16", "float32"],
                   default=train_options.CaptureOptions.feature_dtype, help="stored precision")
    add_tp(c)
    _add_train_parser(sub)
    d = sub.add_parser("draft", help="draft checkpoints: import another tool's EAGLE-3 draft")
    dd = d.add_subparsers(dest="draft_command", required=True, metavar="SUBCOMMAND")
    i = dd.add_parser("import", help="re-write an SGLang/SpecForge/vLLM EAGLE-3 draft as an eaglet draft",
                      description="Re-write an SGLang/SpecForge/vLLM EAGLE-3 draft as an eaglet draft with "
                                  "explicit capture points, checked against the target.")
    i.add_argument("src", metavar="SRC", help="the draft directory to import (config.json and safetensors)")
    i.add_argument("out", metavar="OUT", help="where the eaglet draft is written: a new or empty directory")
    i.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT (atomically, once written)")
    add_target(i, context=False)
    i.add_argument("--capture-ids", type=point_list, default=None,
                   help="the draft's capture layer ids, counted as --convention says (default: from its config)")
    i.add_argument("--convention", choices=["eaglet", "vllm", "sglang", "specforge"], default=None,
                   help="how --capture-ids count: eaglet/vllm name points, sglang/specforge 'output of layer i' "
                        "(= eaglet point i+1)")


def _add_train_parser(sub) -> None:
    t = sub.add_parser("train", help="train an EAGLE-3 draft (training-time test); resumes from OUT/checkpoint",
                       description="Train an EAGLE-3 draft with training-time test, validate it, and export it "
                                   "to OUT/draft. A rerun with the same OUT resumes from OUT/checkpoint.")
    tc = train_options.TrainConfig
    add_target(t, context=False)
    t.add_argument("--data", default=train_options.TrainOptions.data,
                   help="JSONL files with answers, comma-separated; or prompts (e.g. 'builtin') with --regenerate")
    t.add_argument("--out", required=True, help="run directory: logs, checkpoint/, draft/ (the export), acc.png")
    t.add_argument("--regenerate", action="store_true", help="first have the target answer --data's prompts")
    t.add_argument("--recipe", choices=sorted(train_options.RECIPES), default=None,
                   help="with --regenerate: set the data and training flags to a named recipe where not given; "
                        "'chat' is the command that made the shipped SmolLM2 draft (--answers greedy,0.7,1.0 "
                        "--max-samples 16000 --self-prompts 20000 --self-prompt-openers 0.5 --follow-ups 0 "
                        "--max-new-tokens 256 --epochs 6; docs/training.md)")
    _add_regen_options(t, "--regen-batch-size", endpoint=False)
    t.add_argument("--regen-budget-min", type=number(0, low_open=True), default=None,
                   help="time for regeneration (default: while the time left still trains --epochs passes "
                        "over the data so far; docs/training.md)")
    t.add_argument("--train-tokens-per-s", type=number(0, low_open=True), default=None,
                   help="padded training tokens per second, for the budget split (default: timed on a few "
                        "steps before regenerating; 98000, SmolLM2's rate on one H200 with validation, where "
                        "several processes train)")
    t.add_argument("--features", default=None,
                   help="offline feature directory (`data capture`) instead of online (default: online)")
    t.add_argument("--val-features", default=None, help="offline features for validation (default: online)")
    t.add_argument("--val-fraction", type=number(0, 1, high_open=True), default=train_options.TrainOptions.val_fraction,
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
    t.add_argument("--label-temperature", type=number(0, low_open=True), default=tc.label_temperature, metavar="T",
                   help="training only: the labels are the target's distribution at temperature T; below 1 they "
                        "weigh its argmax (what greedy serving accepts) more; 1 = as is")
    t.add_argument("--ttt-reach", type=integer(0), default=tc.ttt_reach, metavar="K",
                   help="training only: a TTT step counts an anchor only while the answer's next token was in "
                        "the draft's top K at every earlier step (what a tree branching K ways can reach); 0 = all")
    t.add_argument("--compile-loss", action=argparse.BooleanOptionalAction, default=None,
                   help="fuse the TTT loss's soft cross-entropy with torch.compile (its first step compiles; "
                        "default: on CUDA)")
    t.add_argument("--fused-ttt-attention", action=argparse.BooleanOptionalAction, default=None,
                   help="the TTT attention as a causal flash attention plus the chain's keys, without its dense "
                        "mask (default: on CUDA; the same loss and gradients as the masked one)")
    t.add_argument("--feature-cache", action=argparse.BooleanOptionalAction, default=None,
                   help="keep each conversation's target features in memory after their first pass, so later "
                        "epochs skip the target's forward (default: on CUDA, in the memory training leaves free; "
                        "what does not fit is recomputed)")
    t.add_argument("--target-turns-only", action="store_true",
                   help="loss only on assistant turns the target wrote itself, not on earlier turns of the data")
    t.add_argument("--lr", action=Given, type=number(0, low_open=True), default=tc.lr,
                   help="peak learning rate (AdamW)")
    t.add_argument("--min-lr-ratio", type=number(0, 1), default=tc.min_lr_ratio, help="the cosine ends at lr * this")
    t.add_argument("--warmup-steps", type=integer(0), default=tc.warmup_steps, help="linear warm-up steps")
    t.add_argument("--weight-decay", type=number(0), default=tc.weight_decay, help="AdamW weight decay")
    t.add_argument("--grad-clip", type=number(0, low_open=True), default=tc.grad_clip, help="gradient-norm clip")
    t.add_argument("--epochs", action=Given, type=integer(1), default=tc.epochs, help="passes over the training data")
    t.add_argument("--max-steps", type=integer(1), default=tc.max_steps,
                   help="stop after this many steps (default: epochs)")
    t.add_argument("--batch-tokens", type=integer(16), default=tc.batch_tokens, help="padded tokens per batch and rank")
    t.add_argument("--max-len", type=integer(8), default=tc.max_len,
                   help="tokens per conversation (default: 2048 or the window)")
    t.add_argument("--draft-vocab-size", type=integer(1), default=tc.draft_vocab_size,
                   help="draft vocabulary (default: half the target's, in multiples of 4096, at most 32768)")
    t.add_argument("--draft-intermediate-size", type=integer(1), default=tc.draft_intermediate_size, metavar="N",
                   help="the draft layer's MLP width (default: the target layer's, as EAGLE-3's drafts): more "
                        "capacity at the same hidden size, recorded in the draft's config.json (intermediate_size)")
    t.add_argument("--init-draft", default=None, metavar="DRAFT",
                   help="start from this draft's weights and vocabulary instead of a new draft, to train it on "
                        "more data ('default': the target's shipped draft; it must read the run's --capture "
                        "points); a lower --lr keeps more of what it knows (default: a new draft)")
    t.add_argument("--capture", type=point_list, default=tc.capture_points,
                   help="residual-stream points in eaglet's convention (default: EAGLE-3's [2, N//2, N-3])")
    t.add_argument("--save-every", type=integer(1), default=tc.save_every, help="checkpoint every N steps")
    t.add_argument("--val-every", type=integer(1), default=tc.val_every, help="validate every N steps")
    t.add_argument("--seed", type=int, default=tc.seed, help="seed of the draft's initialisation and the batch order "
                   "(with --regenerate also of the prompt sample and sampling)")
    t.add_argument("--no-autocast", action="store_true", help="no bf16 autocast on CUDA")
    t.add_argument("--tensorboard", action="store_true", help="also log to OUT/tensorboard (needs tensorboard)")
    add_tp(t)
