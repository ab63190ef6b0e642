"""Load a target: the embedded default, an HF checkpoint directory, or a GGUF file."""

from eaglet.loading.target import Target, load_target, resolve_target_dir

__all__ = ["Target", "load_target", "resolve_target_dir"]
