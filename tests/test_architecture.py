"""The plan of the package, kept true: which part of eaglet may import which.

Layers, lowest first. A module may import its own layer and the layers below it, never one
above (function-level imports count too: they are dependencies all the same):

 0  errors, the package root       one-sentence errors and exit statuses
 1  parallel/                      process groups, launching, the rank-0 mirror (torch and errors only)
 2  outputs, interrupt, options,   atomic writes, Ctrl-C, the typed options every command takes (those of
    train_options, capture         the commands that make a draft apart), the capture contract
 3  models/, kv_cache, sampling    the target's math
 4  loading/                       checkpoints into models (models/ never reads loading/)
 5  generate, session, cuda_graph, plain decoding and its running batch, prefill graphs; prompts as chat
    prefill, chat, detokenize,     messages, ids back to text; the draft model
    draft/
 6  speculative/, data/            tree speculative decoding; training data
 7  train/, bench/, serve/         what the commands are made of
 8  doctor/                        checks training against serving with the real code above
 9  commands/                      one module a command: its tp=1 body and what each rank runs
10  cli, cli_args, cli_checks, cli_options, cli_train   the command line, the only users of argparse

A new module must be placed here before the test passes. Also: no file of the package is
longer than 400 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "eaglet"
LAYERS = [
    {"errors", ""},
    {"parallel"},
    {"outputs", "interrupt", "options", "train_options", "capture", "openai_client"},
    {"models", "kv_cache", "sampling"},
    {"loading"},
    {"generate", "session", "cuda_graph", "prefill", "chat", "detokenize", "draft"},
    {"speculative", "data"},
    {"train", "bench", "serve"},
    {"doctor"},
    {"commands"},
    {"cli", "cli_args", "cli_checks", "cli_options", "cli_train"},
]
COMMAND_LINE = {"cli", "cli_args", "cli_checks", "cli_options", "cli_train"}  # the modules that may import argparse
MAX_LINES = 400


def part(module: str) -> str:
    """eaglet.models.llama -> 'models'; eaglet.cli -> 'cli'; eaglet -> ''."""
    return (module.split(".") + [""])[1]


def layer(module: str) -> int | None:
    return next((i for i, parts in enumerate(LAYERS) if part(module) in parts), None)


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path, path: Path) -> set[str]:
    """Every module ``path`` imports (eaglet's and others'), relative imports resolved."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:  # `from eaglet import options` imports a module, not a name
                sub = root.parent.joinpath(*f"{base}.{a.name}".split("."))
                found.add(f"{base}.{a.name}" if sub.with_suffix(".py").exists() or sub.is_dir() else base)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    return {module_name(root, p): imports(root, p) for p in sorted(root.rglob("*.py"))}


def violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in sorted(graph.items()):
        here = layer(mod)
        if here is None:
            bad.append(f"{mod} is in no layer: place it in LAYERS")
            continue
        for dep in sorted(deps):
            top = dep.split(".")[0]
            if top == "argparse" and part(mod) not in COMMAND_LINE:
                bad.append(f"{mod} imports argparse: only the command line ({', '.join(sorted(COMMAND_LINE))}) may")
            if top != "eaglet":
                continue
            there = layer(dep)
            if there is None or there > here:
                bad.append(f"{mod} (layer {here}) imports {dep} (layer {there}), above it")
    return bad


def test_no_module_imports_a_layer_above_its_own():
    assert violations(import_graph()) == []


def test_no_file_of_the_package_is_longer_than_the_limit():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_checker_catches_a_planted_upward_import(tmp_path):
    root = tmp_path / "eaglet"
    for rel, text in {"__init__.py": "", "errors.py": "", "models/__init__.py": "", "loading/__init__.py": "",
                      "loading/target.py": "from eaglet.models import llama\n",
                      "models/llama.py": "def load():\n    from ..loading.target import Target\n",
                      "parallel/__init__.py": "", "parallel/launch.py": "import argparse\nfrom eaglet import errors\n",
                      "cache.py": ""}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    found = violations(import_graph(root))
    assert found == ["eaglet.cache is in no layer: place it in LAYERS",
                     "eaglet.models.llama (layer 3) imports eaglet.loading.target (layer 4), above it",
                     "eaglet.parallel.launch imports argparse: only the command line (cli, cli_args, cli_checks, "
                     "cli_options, cli_train) may"]


def test_a_synthetic_graph_is_judged_by_layer():
    assert violations({"eaglet.parallel.launch": {"eaglet.errors", "torch"},
                       "eaglet.commands.generate": {"eaglet.speculative.load", "eaglet.parallel.launch"}}) == []
    assert violations({"eaglet.parallel.commands": {"eaglet.train.pipeline"}}) == [
        "eaglet.parallel.commands (layer 1) imports eaglet.train.pipeline (layer 7), above it"]
