"""Issue 12's ablations: regenerate once with every data source, then train each variant on its share
of the data within the same time budget, and print one table for docs/training.md.

    python scripts/ablate.py --target /tmp/smol.gguf --out runs/ablate --variants ""      (regeneration only)
    python scripts/ablate.py --target /tmp/smol.gguf --out runs/ablate --variants base,sampled,self,all
    python scripts/ablate.py --target /tmp/smol.gguf --out runs/ablate \
        --variants all-norm,all-norm-noise,all-target-turns

Plan for one H200 (docs/training.md, "Next session on the H200"): regeneration capped at 6
minutes for a sample of 8,000 training prompts and all 1,561 validation prompts (greedy plus
sampled answers at 0.7 and 1.0, 3,000 Magpie prompts, second turns for a quarter, answers up to
512 tokens: about 40k answers), then 7 variants x 1.5 minutes of training (tokenizing not
counted), each validated on the same records (unseen evals, human-eval, held-back chats,
held-out Magpie prompts, second turns of those), scored per source. ``--serve N`` also
measures the accept length in serving (``eaglet bench``, greedy, eager, trees 6,8,48 and 5,2,8: issue 12's
GPU and CPU trees, policy off) on N bench prompts and N of ``other_prompts.jsonl``, kinds no training prompt comes
from (about a minute per variant). A dry run on the CPU: a small random target directory (SmolLM2's
tokenizer), ``--device cpu --max-samples 24 --max-val-samples 40 --self-prompts 16
--max-new-tokens 24 --regen-batch-size 16 --train-min 0.3``.

The shipped recipe's options, one change at a time (session 48's plan; ~20 minutes of an H200):

    python scripts/ablate.py --target /tmp/smol.gguf --out runs/ablate --recipe chat --regen-min 3.5 \
        --train-min 3 --variants chat,chat-lr1e-3,chat-vocab-all

``--warm-up-steps N`` trains the first variant N untimed steps first (into ``OUT/warm-up``, whose tokens it then
reads), so that torch's compile of the training step falls outside its minutes as it does for the later variants.

``--recipe chat`` regenerates as ``eaglet train --regenerate --recipe chat`` does (greedy answers and answers at 0.7
and 1.0, 16,000 corpus prompts, 20,000 self-written ones, half of them steered, no second turns, answers up to 256
tokens), cut by ``--regen-min``.

``--final MIN`` then trains the records and options of the best variant so far (``macro_tau``: the
predicted accept length averaged over the validation sources) from scratch for MIN minutes into
``OUT/final`` (the shipped draft of 2026-12-01 is ``--final 7.5`` after four variants).

Everything resumes: regeneration from its files, each variant from its checkpoint, each with
what its budget has left (``clock.json``); a variant trained to its budget (``train.json``) is
only scored again, a finished one (``OUT/<name>/result.json``) is not run again. Variants train on the regenerated file
filtered by answer setting and source; validation records are never filtered.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eaglet.data.prompts import Conversation, load_conversations, split_train_val  # noqa: E402
from eaglet.draft.compat import load_draft_for  # noqa: E402
from eaglet.errors import Interrupted  # noqa: E402
from eaglet.train.budget import CLOCK_NAME, spent  # noqa: E402
from eaglet.train.dist import SINGLE_PROCESS, DistInfo  # noqa: E402
from eaglet.train.evaluate import evaluate_sources  # noqa: E402
from eaglet.train.pipeline import eos_ids, regenerate_run, run_train, tokenized  # noqa: E402
from eaglet.train_options import RECIPES, RegenConfig, TrainConfig  # noqa: E402

# name -> (which training records, TrainConfig options). Records: "greedy" (the greedy answers of
# corpus prompts), "sampled" (+ answers at 0.7 and 1.0), "self" (+ Magpie prompts), "steered" (+ Magpie prompts
# started with an opener), "turns" (+ second turns).
PLAIN = {"aux_norm": False}  # the data variants without the recipe's options (aux_norm is on by default)
CHAT = ("greedy", "sampled", "self", "steered")
VARIANTS = {
    "base": (("greedy",), PLAIN),
    "sampled": (("greedy", "sampled"), PLAIN),
    "self": (("greedy", "sampled", "self"), PLAIN),
    "all": (("greedy", "sampled", "self", "turns"), PLAIN),
    "all-norm": (("greedy", "sampled", "self", "turns"), {"aux_norm": True}),
    "all-norm-noise": (("greedy", "sampled", "self", "turns"), {"aux_norm": True, "aux_noise": 0.05}),
    "all-target-turns": (("greedy", "sampled", "self", "turns"), {**PLAIN, "earlier_turns": False}),
    # Session 9's draft plateaued with training accuracy equal to validation's (~0.79): underfit, so the
    # learning rate (default 5e-4) is the next lever to measure.
    "all-norm-lr1e-3": (("greedy", "sampled", "self", "turns"), {"aux_norm": True, "lr": 1e-3}),
    "all-norm-lr2e-3": (("greedy", "sampled", "self", "turns"), {"aux_norm": True, "lr": 2e-3}),
    # + the Magpie prompts started with an opener (--self-prompt-openers): writing and role-play, the kinds
    # the draft served worst, are what the target seldom writes unprompted.
    "all-norm-steered": (("greedy", "sampled", "self", "steered", "turns"), {"aux_norm": True}),
    # The draft vocabulary before session 12 (12,288 of SmolLM2's 49,152; the default is half the target's now):
    # on greedy data alone the larger one accepted 0.24 more tokens on both serving sets (docs/training.md).
    "all-norm-vocab12k": (("greedy", "sampled", "self", "turns"), {"aux_norm": True, "draft_vocab_size": 12288}),
    # The draft's capacity (--draft-intermediate-size; SmolLM2's layer is 1,536 wide): validation acc_0 stayed at
    # 0.81 with twice the data (session 34). At equal minutes a wider MLP trains fewer tokens a second, so a short
    # budget may understate it.
    "all-norm-mlp2x": (("greedy", "sampled", "self", "turns"), {"aux_norm": True, "draft_intermediate_size": 3072}),
    "all-norm-mlp4x": (("greedy", "sampled", "self", "turns"), {"aux_norm": True, "draft_intermediate_size": 6144}),
    # The shipped recipe's data (`--recipe chat`: no second turns) and options, then one change each (session 48: a
    # wider MLP and more data each left validation where the recipe has it, acc_0 ~0.80). The variants see the same
    # minutes, so a larger batch makes fewer steps, and the rate decays within them: session 49's 2.5 minutes put
    # lr 1e-3 and 2e-3 far ahead, decay 1.0 and the whole vocabulary behind (docs/training.md).
    "chat": (CHAT, {}),
    "chat-lr1e-3": (CHAT, {"lr": 1e-3}),
    "chat-lr2e-3": (CHAT, {"lr": 2e-3}),
    "chat-lr2.5e-4": (CHAT, {"lr": 2.5e-4}),
    "chat-bt32k": (CHAT, {"batch_tokens": 32768}),
    "chat-decay1": (CHAT, {"decay": 1.0}),  # every TTT step's loss weighed alike (the recipe: 0.8 ** j)
    # A head over the whole vocabulary: ~2% of the tokens the target writes lie outside the 24,576 (session 39).
    "chat-vocab-all": (CHAT, {"draft_vocab_size": "all"}),  # "all": the target's vocabulary size
    # Without the sampled answers of corpus prompts: the self-written prompts' long answers weigh more.
    "chat-greedy-self": (("greedy", "self", "steered"), {}),
    # The target's distribution sharpened as labels (--label-temperature): greedy serving accepts its argmax.
    # Session 35's probe refitting the LM head alone lost with a hard argmax term; the whole draft may differ.
    "chat-label0.5": (CHAT, {"label_temperature": 0.5}),
    "chat-label0.25": (CHAT, {"label_temperature": 0.25}),
    "chat-label0.125": (CHAT, {"label_temperature": 0.125}),
    # Later TTT steps trained only on anchors a tree can reach (--ttt-reach K: the target's token in the draft's top K
    # at each earlier step; GRIFFIN's token-alignable training). 8: the 6,8,48 tree's branching; 2: 5,2,8's.
    "chat-reach8": (CHAT, {"ttt_reach": 8}),
    "chat-reach2": (CHAT, {"ttt_reach": 2}),
}
GROUPS = ("unseen evals", "human-eval", "held-back chats", "held-out Magpie", "second turns")


def kind(c: Conversation) -> str:
    if "+2" in c.id:
        return "turns"
    if c.source in ("self", "self-steered"):
        return c.source.removeprefix("self-")
    return "sampled" if "~t" in c.id else "greedy"


def group(c: Conversation) -> str:
    if "+2" in c.id:
        return "second turns"
    return {"human-eval": "human-eval", "chitchat-heldout": "held-back chats",
            "self-heldout": "held-out Magpie"}.get(c.source or "", "unseen evals")


def variant(name: str, vocab_size: int) -> tuple[tuple[str, ...], dict]:
    """Variant ``name``'s record kinds and TrainConfig options for a target of ``vocab_size`` tokens."""
    kinds, options = VARIANTS[name]
    return kinds, {k: vocab_size if v == "all" else v for k, v in options.items()}


def write_variant(convs: list[Conversation], kinds: tuple[str, ...], path: Path) -> int:
    """The variant's records as JSONL: its training kinds, and every validation record."""
    keep = [c for c in convs if c.split == "val" or kind(c) in kinds]
    lines = [json.dumps({"id": c.id, "messages": list(c.messages), "split": c.split, "source": c.source,
                         "finish_reason": "length" if c.truncated else "stop", "target_turns": c.target_turns,
                         **({"answer_ids": list(c.answer_ids)} if c.answer_ids is not None else {})})
             for c in keep]
    path.write_text("\n".join(lines) + "\n")
    return sum(c.split != "val" for c in keep)


def tokenize_variant(target, data: str, run: Path, cfg: TrainConfig, dist: DistInfo) -> None:
    """Tokenized outside the budget (run_train finds the cache): ~40k records take tens of seconds, which would
    leave the larger variants less training time than the smaller ones."""
    max_len = cfg.seq_len(target.config.max_position_embeddings)
    for part, file in zip(split_train_val([c for c in load_conversations(data) if c.has_answer], 0.02),
                          ("tokens-train", "tokens-val")):
        if part:
            tokenized(target, part, run / f"{file}.safetensors", max_len, dist, cfg.earlier_turns)


def variant_records(convs: list[Conversation], template: str, out: Path,
                    vocab_size: int) -> tuple[tuple[str, ...], dict, str, int]:
    """Variant ``template``'s record kinds and options, its records file OUT/data-<template>.jsonl (written) and how
    many training records it holds."""
    kinds, options = variant(template, vocab_size)
    data = out / f"data-{template}.jsonl"
    return kinds, options, str(data), write_variant(convs, kinds, data)


def variant_config(args, options: dict, **more) -> TrainConfig:
    return TrainConfig(epochs=args.epochs, val_every=10**9, save_every=500, **{**args.train_base, **options, **more})


def train_variant(args, target, convs: list[Conversation], val: list[Conversation], name: str, out: Path,
                  minutes: float, like: str | None = None) -> dict:
    """Train variant ``name`` (or, as ``name``, the records and options of variant ``like``) on its share
    of ``convs`` within ``minutes``, then score it per source."""
    run = out / name
    run.mkdir(exist_ok=True)
    # the final shares its template's records file
    kinds, options, data, n_train = variant_records(convs, like or name, out, target.config.vocab_size)
    cfg = variant_config(args, options)
    trained = run / "train.json"
    if trained.is_file():  # trained to its budget by an earlier command that stopped while scoring
        res = json.loads(trained.read_text())
    else:
        dist = DistInfo(device=torch.device(args.device))  # the target's (DistInfo's default is the CPU)
        tokenize_variant(target, data, run, cfg, dist)
        # A resumed variant (Ctrl-C) gets what its budget has left: every variant trains --train-min in all.
        with spent(run / CLOCK_NAME) as clock:
            res = run_train(target, data, run, cfg, dist, time_budget_s=max(1.0, 60 * minutes - clock.before))
        trained.write_text(json.dumps(res))
    draft, _ = load_draft_for(run / "draft", target, device=args.device)
    sources = evaluate_sources(target, draft, val, eos_ids(target), cfg.ttt_steps, cfg.decay,
                               earlier_turns=cfg.earlier_turns)
    return {"kinds": list(kinds), "options": options, "minutes": minutes, "train_records": n_train,
            "steps": res["steps"], "epochs_done": res["epochs_done"], "val": res["val"], "sources": sources,
            "train_seconds": res["seconds_this_run"]}


def warm_up(args, target, convs: list[Conversation], name: str, out: Path, steps: int) -> None:
    """``steps`` untimed training steps of variant ``name`` into OUT/warm-up, whose tokens then serve the variant's
    own run: a fresh machine compiles the training step within its first variant's minutes otherwise (session
    49's first variant made ~90 of ~1,000 steps fewer than the later ones, which found the kernels on disk).
    Always afresh: a later plan's warm-up resumed an earlier one's checkpoint at its last step and trained none."""
    warm, run = out / "warm-up", out / name
    shutil.rmtree(warm, ignore_errors=True)
    warm.mkdir()
    run.mkdir(exist_ok=True)
    _, options, data, _ = variant_records(convs, name, out, target.config.vocab_size)
    cfg = variant_config(args, options, max_steps=steps)
    dist = DistInfo(device=torch.device(args.device))
    tokenize_variant(target, data, warm, cfg, dist)
    run_train(target, data, warm, cfg, dist)
    for f in warm.glob("tokens-*.safetensors"):  # the same records and options: tokenizing would repeat
        shutil.copy(f, run / f.name)


def macro_tau(row: dict) -> float:
    """The predicted accept length averaged over the validation sources, each counting once: pooled, the
    sources with the longest answers would decide (held-back chats held a third of the positions). Over
    each answer's first SERVE_WINDOW tokens where recorded: the later tokens of long answers are easier
    than what serving decodes."""
    taus = [src.get("tau_serve", src.get("tau_all", src["tau_pred"])) for g, src in row["sources"].items()
            if g in GROUPS]
    return sum(taus) / len(taus) if taus else row["val"]["tau_pred"]


def best_variant(finished: dict[str, dict]) -> str:
    """The finished variant whose draft validated best (``macro_tau``); the first one on a tie."""
    return max((n for n in finished if n in VARIANTS), key=lambda n: macro_tau(finished[n]))


SERVE_TREES = {"": (6, 8, 48), " 5,2,8": (5, 2, 8)}  # issue 12's GPU tree and its CPU one: column suffix -> tree
SERVED = [name + suffix for suffix in SERVE_TREES for name in ("bench", "other")]


def serve(args, draft: Path, out: Path) -> dict:
    """Accept length in serving on the bench prompts and on other_prompts.jsonl with each of ``SERVE_TREES``
    (one ``eaglet bench`` a tree, each set reported on its own), as ``scripts/h200/plan_train.sh`` measures a
    draft; keys "bench", "other", "bench 5,2,8", "other 5,2,8"."""
    other = REPO / "eaglet/data/corpus/other_prompts.jsonl"
    res = {}
    for suffix, (steps, topk, tokens) in SERVE_TREES.items():
        bench = out / f"bench-{steps}-{topk}-{tokens}"
        cmd = [sys.executable, "-m", "eaglet.cli", "bench", "--target", args.target, "--draft", str(draft),
               "--prompts", f"builtin,{other}", "--limit", str(args.serve), "--max-new-tokens", "128",
               "--methods", "spec", "--num-steps", str(steps), "--tree-topk", str(topk),
               "--num-draft-tokens", str(tokens), "--policy", "off", "--device", args.device,
               # accept lengths do not depend on fusion; compiling costs tens of seconds a run
               "--no-compile", "--no-compile-prefill", "--out", str(bench)]
        subprocess.run(cmd, check=True, cwd=REPO)
        by_set = json.loads((bench / "report.json").read_text())["by_set"]
        for name, key in (("bench", "builtin"), ("other", other.stem)):
            res[name + suffix] = by_set[key]["methods"]["spec"]["accept_length"]
    return res


def table(results: dict[str, dict], steps: int) -> str:
    accs = " | ".join(f"acc_{j}" for j in range(steps))
    head = (f"| variant | train records | steps | epochs | {accs} | tau_pred | tau_all | tau_serve | macro | "
            + " | ".join(GROUPS) + "".join(f" | serving {k}" for k in SERVED) + " |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for name, r in results.items():
        val = r["val"]
        per = [r["sources"].get(g, {}).get("tau_pred", "") for g in GROUPS]
        lines.append(f"| {name} | {r['train_records']} | {r['steps']} | {r['epochs_done']:.2f} | "
                     + " | ".join(f"{val[f'acc_{j}']:.3f}" for j in range(steps)) + f" | {val['tau_pred']:.2f} | "
                     + " | ".join(f"{val[k]:.2f}" if k in val else "" for k in ("tau_all", "tau_serve"))
                     + f" | {macro_tau(r):.2f} | "
                     + " | ".join(str(x) for x in per)
                     + "".join(f" | {r.get('serve', {}).get(k, '')}" for k in SERVED) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--device", default="cuda")
    p.add_argument("--data", default="builtin")
    p.add_argument("--regen-min", type=float, default=6.0, help="regeneration budget in minutes")
    p.add_argument("--train-min", type=float, default=1.5, help="training minutes per variant (tokenizing not counted)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated; '' regenerates only")
    p.add_argument("--answers", default="0,0.7,1.0")
    p.add_argument("--max-samples", type=int, default=8000, help="training prompts of --data (a seeded sample)")
    p.add_argument("--max-val-samples", type=int, help="validation prompts (a seeded sample; default: all 1,561)")
    p.add_argument("--self-prompts", type=int, default=3000)
    p.add_argument("--self-prompt-openers", type=float, default=0.5,
                   help="share of the Magpie prompts started with an opener (kind 'steered'; all-norm-steered "
                        "and the chat variants train on them)")
    p.add_argument("--follow-ups", type=float, default=0.25)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--regen-batch-size", type=int, help="default: refill.auto_rows (from the free GPU memory)")
    p.add_argument("--epochs", type=int, default=20, help="an upper bound; the time budget ends each run")
    p.add_argument("--final", type=float, default=0.0,
                   help="then train the records and options of the best variant so far (macro_tau) "
                        "for this many minutes into OUT/final")
    p.add_argument("--serve", type=int, default=0, help="prompts per serving measurement (0: none)")
    p.add_argument("--warm-up-steps", type=int, default=0,
                   help="train the first variant this many untimed steps first, so that it does not compile "
                        "torch's kernels within its minutes (0: none)")
    p.add_argument("--recipe", choices=sorted(RECIPES),
                   help="regenerate as `eaglet train --regenerate --recipe NAME` does (its answer settings, "
                        "prompts, self-written prompts, openers, second turns and answer length) where those flags "
                        "are not given; its training options are every variant's base")
    recipe = RECIPES.get(p.parse_known_args(argv)[0].recipe, {})
    training = {f.name for f in fields(TrainConfig)}
    # --epochs stays an upper bound here; the recipe's other training options (the learning rate, say) are every
    # variant's base, so its `chat` is the recipe; its regeneration flags are defaults (--answers is text).
    p.set_defaults(train_base={k: v for k, v in recipe.items() if k in training and k != "epochs"})
    if recipe:
        p.set_defaults(**{k: v for k, v in recipe.items() if k not in training and k != "answers"},
                       answers=",".join(f"{a:g}" for a in recipe["answers"]))
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")

    from eaglet.loading import load_target

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_target(args.target, dtype=torch.bfloat16 if args.device.startswith("cuda") else torch.float32,
                         device=args.device)
    rc = RegenConfig(batch_size=args.regen_batch_size, max_new_tokens=args.max_new_tokens,
                     answers=tuple(float(a) for a in args.answers.split(",")), max_samples=args.max_samples,
                     max_val_samples=args.max_val_samples,
                     self_prompts=args.self_prompts, follow_ups=args.follow_ups,
                     self_prompt_openers=args.self_prompt_openers)
    t0 = time.time()
    regen_dir = out / "data"
    regen_dir.mkdir(exist_ok=True)
    with spent(regen_dir / CLOCK_NAME) as clock:  # an interrupted regeneration resumes with what --regen-min has left
        deadline = t0 + 60 * args.regen_min - clock.before
        data = regenerate_run(target, args.data, regen_dir, rc, SINGLE_PROCESS, lambda _: time.time() >= deadline, 0.0)
    convs = [c for c in load_conversations(data) if c.has_answer]
    regen_s = time.time() - t0
    print(f"regeneration: {len(convs)} records in {regen_s:.0f} s (resumed runs count only this run)", flush=True)
    val = [replace(c, source=group(c)) for c in convs if c.split == "val"]
    if args.warm_up_steps and names and not (out / names[0] / "train.json").is_file():
        warm_up(args, target, convs, names[0], out, args.warm_up_steps)
    for name in names:
        run = out / name
        done = run / "result.json"
        row = json.loads(done.read_text()) if done.is_file() else \
            train_variant(args, target, convs, val, name, out, args.train_min)
        if args.serve and "serve" not in row:
            row["serve"] = serve(args, run / "draft", run)
        done.write_text(json.dumps(row, indent=1))
        print(table({name: row}, TrainConfig().ttt_steps), flush=True)
    finished = {n: json.loads((out / n / "result.json").read_text()) for n in VARIANTS
                if (out / n / "result.json").is_file()}  # every variant run so far, by any command
    if args.final and not (out / "final" / "result.json").is_file():
        if not finished:
            sys.exit("--final needs at least one finished variant to choose from")
        best = best_variant(finished)
        print(f"final: the records and options of {best!r} for {args.final} min", flush=True)
        (out / "final").mkdir(exist_ok=True)
        for f in (out / best).glob("tokens-*.safetensors"):  # same records and options: tokenizing would repeat
            shutil.copy(f, out / "final" / f.name)
        row = train_variant(args, target, convs, val, "final", out, args.final, like=best)
        (out / "final" / "result.json").write_text(json.dumps({**row, "like": best}, indent=1))
    if (out / "final" / "result.json").is_file():
        finished["final"] = json.loads((out / "final" / "result.json").read_text())
    text = table(finished, TrainConfig().ttt_steps)
    (out / "ablation.md").write_text(text + "\n")
    print(f"\nregeneration {regen_s:.0f} s this run; training {args.train_min} min per variant\n\n{text}")


if __name__ == "__main__":
    try:
        main()
    except Interrupted as e:  # Ctrl-C: what was done is saved; the same command resumes
        sys.exit(f"eaglet: {e}")
