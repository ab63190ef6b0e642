"""User-facing errors: one clear sentence, printed by the CLI without a traceback; and the exit statuses."""

EXIT_CHECK_FAILED = 1  # eaglet doctor found a failed check
EXIT_USAGE = 2  # an error the user can fix: a bad option, path, file or configuration
EXIT_INTERNAL = 70  # a bug in eaglet (sysexits' EX_SOFTWARE); the traceback goes to a log file
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM (128 + SIGINT), after saving the progress


class EagletError(Exception):
    """An error the user can cause and fix (bad path, bad config, bad value).

    The CLI prints ``str(err)`` on one line and exits with status 2.
    """
