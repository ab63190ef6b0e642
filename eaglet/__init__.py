"""eaglet: train EAGLE-3 drafts and serve their target with tree speculative decoding."""

__version__ = "0.1.0"
