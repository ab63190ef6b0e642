"""Everything on the command line is checked before a model loads; cli.py uses this module.

Two kinds of check:

- value types for argparse (a number in range, a known device, a non-empty text): a
  bad value is refused while parsing, and argparse names the option;
- ``check(args)``, run right after parsing: inputs exist and are readable, outputs are
  writable and never someone else's files, options that go together are all there.

Every refusal is one sentence naming the option, the value and the fix (exit status 2).
Files eaglet did not write are never overwritten: an output directory must be new,
empty, or recognisably eaglet's own (it holds one of the files that command writes).
"""

from __future__ import annotations

import os
import tempfile
from argparse import ArgumentTypeError, Namespace
from collections.abc import Callable
from pathlib import Path

from eaglet.errors import EagletError
from eaglet.train.budget import CLOCK_NAME

# --- value types -------------------------------------------------------------------------------------------


def integer(low: int) -> Callable[[str], int]:
    """An integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < low:
            raise ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return n

    return parse


def number(low: float, high: float | None = None, low_open: bool = False, high_open: bool = False
           ) -> Callable[[str], float]:
    """A float in the interval [low, high] (either end open when asked; ``high`` None: unbounded)."""
    what = (f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}" if high is not None
            else f"{'>' if low_open else '>='} {low:g}")
    kind = "a number in " if high is not None else "a number "

    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            x = float("nan")
        ok = (x > low if low_open else x >= low) and (high is None or (x < high if high_open else x <= high))
        if not ok:  # NaN fails every comparison
            raise ArgumentTypeError(f"expected {kind}{what}, got {text!r}")
        return x

    return parse


def _ints(text: str) -> tuple[int, ...]:
    """Comma-separated integers; () when any is not one."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        return ()


def point_list(text: str) -> tuple[int, ...]:
    """Comma-separated non-negative integers (capture points or layer ids), at least one."""
    ids = _ints(text)
    if not ids or min(ids) < 0:
        raise ArgumentTypeError(f"expected comma-separated non-negative integers such as 2,15,27, got {text!r}")
    return ids


def size_list(text: str) -> tuple[int, ...]:
    """Comma-separated distinct positive integers (batch sizes), ascending."""
    sizes = _ints(text)
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise ArgumentTypeError(f"expected distinct positive integers such as 1,16,64, got {text!r}")
    return tuple(sorted(sizes))


def answer_list(text: str) -> tuple[float, ...]:
    """Answer settings: 'greedy' (0) and sampling temperatures > 0, comma-separated and distinct."""
    try:
        temps = tuple(0.0 if x.strip() == "greedy" else float(x) for x in text.split(",") if x.strip())
    except ValueError:
        temps = ()
    if not temps or len(set(temps)) != len(temps) or not all(t >= 0 and t == t and t != float("inf") for t in temps):
        raise ArgumentTypeError(f"expected distinct settings such as greedy,0.7,1.0 ('greedy' or a temperature "
                                f"> 0), got {text!r}")
    return temps


def url(text: str) -> str:
    """An http(s) URL with a host (and a valid port, if any): a server's address."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query and not parts.fragment
        parts.port  # noqa: B018  (raises on a port that is no number in 0..65535)
    except ValueError:
        ok = False
    if not ok:
        raise ArgumentTypeError(f"expected a server URL such as http://127.0.0.1:8000, got {text!r}")
    return text


def nonempty(text: str) -> str:
    if not text.strip():
        raise ArgumentTypeError("expected some text, got an empty string")
    return text


def device(text: str) -> str:
    """cpu, cuda or cuda:N, and CUDA only where a device is visible."""
    import torch

    try:
        dev = torch.device(text)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    if dev.type == "cuda":
        have = torch.cuda.device_count()
        if (dev.index or 0) >= have:
            raise ArgumentTypeError(f"{text!r} was asked for but {have} CUDA devices are visible; use --device cpu")
    return text


# --- filesystem checks -------------------------------------------------------------------------------------


def _named(flag: str, check: Callable, *args):
    """Run a library check, prefixing its sentence with the option it judges."""
    try:
        return check(*args)
    except EagletError as e:
        raise EagletError(f"{flag}: {e}") from None


def _writable(flag: str, path: Path) -> None:
    """``path`` can be written: an existing directory is writable, else its nearest existing ancestor is."""
    anc = path.absolute() if path.is_dir() else path.absolute().parent
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise EagletError(f"{flag} {path}: {anc} is a file, not a directory; pass a path in a directory")
    try:  # os.access says yes to root even on a read-only filesystem: try it
        fd, probe = tempfile.mkstemp(prefix=".eaglet-probe-", dir=anc)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise EagletError(f"{flag} {path}: cannot write in {anc} ({e.strerror}); pass a writable location") from None


def output_file(flag: str, value: str, example: str) -> Path:
    path = Path(value).expanduser()
    if path.is_dir():
        raise EagletError(f"{flag} {value} is a directory; pass a file path inside it, e.g. {path / example}")
    _writable(flag, path)
    return path


def output_dir(flag: str, value: str, ours: tuple[str, ...]) -> Path:
    """A directory the command may write into: new, empty, or holding one of ``ours`` (an earlier run's files)."""
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise EagletError(f"{flag} {value} is a file; pass a directory")
    if path.is_dir() and any(path.iterdir()) and not any((path / name).exists() for name in ours):
        raise EagletError(f"{flag} {value} already holds files that eaglet did not write; "
                          "pass a new or empty directory")
    _writable(flag, path)
    return path


def input_files(flag: str, value: str, builtin: bool = True) -> list[Path]:
    """A comma-separated list of readable files ('builtin' allowed where ``builtin``)."""
    paths = []
    for part in (p for p in value.split(",") if p):
        if builtin and part == "builtin":
            continue
        path = Path(part).expanduser()
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "does not exist"
            fix = "a JSONL file or 'builtin'" if builtin else "a JSONL file"
            raise EagletError(f"{flag} {part} {what}; pass {fix}")
        try:
            with open(path, "rb") as fh:
                fh.read(1)
        except OSError as e:
            raise EagletError(f"{flag} {part} cannot be read ({e.strerror})") from None
        paths.append(path)
    if not paths and not (builtin and "builtin" in value.split(",")):
        raise EagletError(f"{flag} {value!r} names no file")
    return paths


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve() == folder.resolve() or folder.resolve() in path.resolve().parents


# --- per command -------------------------------------------------------------------------------------------


def _target(args: Namespace) -> None:
    from eaglet.loading.hf import read_config
    from eaglet.loading.target import locate_target

    path = _named("--target", locate_target, args.target)
    if path.is_dir():
        _named("--target", read_config, path)


def _draft(flag: str, value: str) -> None:
    if value not in ("default", "none"):
        from eaglet.draft.checkpoint import check_draft_dir

        _named(flag, check_draft_dir, Path(value).expanduser())


def _draft_vocab(args: Namespace) -> None:
    """--draft-vocab keeps a prefix of the draft's vocabulary: only a frequency-ordered draft's is its most frequent
    tokens (the shipped default draft is checked when it loads)."""
    if args.draft_vocab is None or args.draft in ("default", "none"):
        return
    import json

    from eaglet.draft.checkpoint import listed_by_frequency

    if not listed_by_frequency(json.loads((Path(args.draft).expanduser() / "config.json").read_text())):
        raise EagletError(f"--draft-vocab {args.draft_vocab}: the draft at {args.draft} lists its vocabulary by "
                          "token id, not by frequency (trained before 2026-12-02 or by another tool), so no prefix "
                          "of it is the most frequent tokens; leave --draft-vocab out")


def _features(flag: str, value: str | None) -> None:
    if value is not None:
        from eaglet.data.features import check_feature_dir

        _named(flag, check_feature_dir, Path(value).expanduser())


def _tree(args: Namespace) -> None:
    given = {"--num-steps": args.num_steps, "--tree-topk": args.topk, "--num-draft-tokens": args.num_draft_tokens}
    if all(v is None for v in given.values()):
        return
    if any(v is None for v in given.values()):
        missing = ", ".join(k for k, v in given.items() if v is None)
        raise EagletError(f"set all of --num-steps, --tree-topk and --num-draft-tokens, or none (automatic); "
                          f"missing {missing}")
    from eaglet.options import TreeConfig

    TreeConfig(args.num_steps, args.topk, args.num_draft_tokens)  # consistency, in the engine's own words


def _generate(args: Namespace) -> None:
    _target(args)
    _draft("--draft", args.draft)
    _draft_vocab(args)
    _tree(args)


def _bench(args: Namespace) -> None:
    input_files("--prompts", args.prompts)  # one set or several, 'builtin' among them
    output_dir("--out", args.out, ours=("report.json",))
    if args.endpoint:  # a running server is measured: no model of ours is loaded
        return
    _target(args)
    if "spec" in args.methods.split(","):
        _draft("--draft", args.draft)
        _draft_vocab(args)
    _tree(args)


def _regenerate(args: Namespace) -> None:
    _target(args)
    inputs = input_files("--data", args.data)
    out = output_file("--out", args.out, "answers.jsonl")
    if any(_inside(out, p) for p in inputs):
        raise EagletError(f"--out {args.out} is also an input of --data; write the answers to another file")
    _follow_ups(args)
    if args.endpoint is None:
        given = [k for k, v in (("--model", args.model), ("--concurrency", args.concurrency)) if v is not None]
        if given:
            one = len(given) == 1
            raise EagletError(f"{' and '.join(given)} appl{'ies' if one else 'y'} only with --endpoint URL; add it, "
                              f"or leave {'it' if one else 'them'} out")
    else:
        local = [k for k, v in (("--self-prompts", args.self_prompts), ("--follow-ups", args.follow_ups)) if v]
        if local:
            one = len(local) == 1
            raise EagletError(f"{' and '.join(local)} need{'s' * one} the local target (the target writes user "
                              f"turns from its raw template), not --endpoint; regenerate without "
                              f"{'it' if one else 'them'}, or without --endpoint")


def _capture(args: Namespace) -> None:
    _target(args)
    input_files("--data", args.data, builtin=False)
    output_dir("--out", args.out, ours=("manifest.json",))


def _train(args: Namespace) -> None:
    _target(args)
    if args.data == "builtin" and not args.regenerate:
        raise EagletError("--data builtin holds prompts only; add --regenerate to have the target answer them, "
                          "or pass a JSONL file with answers")
    inputs = input_files("--data", args.data)
    out = output_dir("--out", args.out, ours=("checkpoint", "train_log.jsonl", "tokens-train.safetensors", CLOCK_NAME,
                                              "regenerated.jsonl", "regenerated-0.jsonl", "draft",
                                              "regenerated.self-prompts.jsonl", "regenerated-0.self-prompts.jsonl"))
    if args.regenerate and any(_inside(p.parent, out) and p.name.startswith("regenerated") for p in inputs):
        raise EagletError(f"--data {args.data} is where --regenerate writes its answers in --out {args.out}; "
                          "pass the prompts from another file")
    _features("--features", args.features)
    _features("--val-features", args.val_features)
    if args.init_draft is not None:
        _draft("--init-draft", args.init_draft)
    regen_only = {"--self-prompts": args.self_prompts, "--self-prompt-openers": args.self_prompt_openers,
                  "--follow-ups": args.follow_ups,
                  "--answers": args.answers != (0.0,), "--regen-budget-min": args.regen_budget_min}
    given = [k for k, v in regen_only.items() if v]
    if given and not args.regenerate:
        one = len(given) == 1
        raise EagletError(f"{', '.join(given)} shape{'s' * one} the data --regenerate writes; add --regenerate, "
                          f"or leave {'it' if one else 'them'} out")
    if args.train_tokens_per_s and not (args.regenerate and args.time_budget_min):
        raise EagletError("--train-tokens-per-s only splits a --time-budget-min between --regenerate and training; "
                          "add both, or leave it out")
    _follow_ups(args)


def _follow_ups(args: Namespace) -> None:
    """The options of the turns the target writes (``data regenerate`` and ``train --regenerate``)."""
    if args.self_prompt_openers and not args.self_prompts:
        raise EagletError("--self-prompt-openers starts some of the --self-prompts, but none are asked for; add "
                          "--self-prompts N, or leave it out")
    if args.follow_ups and 0.0 not in args.answers:
        given = ",".join(f"{t:g}" for t in args.answers)
        raise EagletError(f"--follow-ups continue the greedy answers, but --answers {given} has no greedy setting; "
                          "add 'greedy' to --answers")


def _draft_import(args: Namespace) -> None:
    _target(args)
    src, out = Path(args.src).expanduser(), Path(args.out).expanduser()
    _draft("SRC", args.src)
    if args.capture_ids is not None and args.convention is None:
        raise EagletError("--capture-ids needs --convention (eaglet, vllm, sglang or specforge) to say how they count")
    if out.exists() and not out.is_dir():
        raise EagletError(f"OUT {args.out} is a file; pass a directory for the imported draft")
    if _inside(src, out) or _inside(Path.cwd(), out):
        what = "the current directory" if _inside(Path.cwd(), out) else f"SRC {args.src}"
        raise EagletError(f"OUT {args.out} holds {what}, which an import may not replace; pass a new directory")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise EagletError(f"OUT {args.out} is not empty; pass a new directory, or --overwrite to replace it")
    _writable("OUT", out)


def _doctor(args: Namespace) -> None:
    _target(args)
    _draft("--draft", args.draft)
    if args.prompts != "builtin":
        input_files("--prompts", args.prompts, builtin=False)
    _features("--features", args.features)
    if args.json is not None:
        output_file("--json", args.json, "doctor.json")
    _tree(args)


def check(args: Namespace) -> None:
    """Refuse, in one sentence, anything on the command line that would fail after loading the model."""
    if args.command == "data":
        {"regenerate": _regenerate, "capture": _capture}[args.data_command](args)
    elif args.command == "draft":
        _draft_import(args)
    else:
        checks = {"generate": _generate, "serve": _generate, "bench": _bench, "train": _train, "doctor": _doctor}
        checks[args.command](args)
