"""Tree speculative decoding: tree.py grows, verify.py checks, accept.py keeps, engine.py loops."""

from eaglet.spec.engine import SpecEngine
from eaglet.spec.load import default_draft_path
from eaglet.spec.tree import TreeConfig

__all__ = ["SpecEngine", "TreeConfig", "default_draft_path"]
