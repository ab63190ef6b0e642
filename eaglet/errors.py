"""User-facing errors: one clear sentence, printed by the CLI without a traceback."""


class EagletError(Exception):
    """An error the user can cause and fix (bad path, bad config, bad value).

    The CLI prints ``str(err)`` on one line and exits with status 2.
    """
