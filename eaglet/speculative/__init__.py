"""Tree speculative decoding: tree.py grows, verify.py checks, accept.py keeps, engine.py loops."""

from eaglet.speculative.engine import SpecEngine
from eaglet.speculative.load import default_draft_path
from eaglet.speculative.tree import TreeConfig

__all__ = ["SpecEngine", "TreeConfig", "default_draft_path"]
