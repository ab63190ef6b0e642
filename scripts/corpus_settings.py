"""The corpus recipe: caps, seeds, split sizes, names (read by build_corpus.py and corpus_readme.py)."""

from __future__ import annotations

from pathlib import Path

SEED = 1234
CAP_PER_EVAL = 60  # at most this many prompts from one eval (validation evals: VAL_CAP_PER_EVAL)
TRAIN_CAP_PER_EVAL = 200  # and a training eval adds up to this many in all (issue 12: more varied data)
VAL_CAP_PER_EVAL = 40  # and at most this many from one validation eval
MAX_CHARS = 1500  # prompts whose message contents sum to more are dropped
MIN_VAL_EVAL_PROMPTS = 15  # an eval needs this many usable prompts to be picked for validation
# SmolLM2 is an English model: outside the "language" category, validation evals are
# picked among mostly-ASCII ones so that validation and benchmarks reflect its real use.
MIN_VAL_ASCII_FRACTION = 0.95
# Whole evals held out for validation, per category (25 in all).
VAL_EVALS_PER_CATEGORY = {
    "reasoning": 5,
    "knowledge": 6,
    "math": 4,
    "language": 5,
    "writing": 2,
    "code": 2,
    "chat": 1,
}
CHITCHAT_WINDOW_TURNS = (3, 5, 7)  # multi-turn chitchat prompts take this many turns
EXTRA_CHITCHAT_WINDOWS = 2  # windows per conversation beyond the first (may repeat one; duplicates are dropped)
# Whole chitchat conversations held back for validation (source "chitchat-heldout"): chat
# validation beside the unseen evals. Chosen by a hash of the conversation id.
CHITCHAT_VAL_FRACTION = 0.04
BENCH_PER_GROUP = 20
HUMAN_EVAL_TEMPLATE = "Complete this Python function:\n\n{prompt}"

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = REPO / "eaglet" / "data" / "corpus"
CORPUS_NAME = "smollm2_prompts.jsonl.xz"
BENCH_NAME = "bench_prompts.jsonl"

# Eval data folders that evals' LICENSE.md lists as NOT under its MIT license
# (third-party datasets with their own licenses, some non-commercial). They are
# also parsed from the installed LICENSE.md at run time; this list is the floor.
NON_MIT_EVAL_DIRS = {
    "already_said_that",
    "ballots",
    "sandbagging",
    "schelling_point",
    "steganography",
    "text_compression",
    "theory_of_mind",
}
