from tests.train.helpers import one_thread, tiny_target, tiny_target_dir  # noqa: F401  (fixtures)
