"""User-facing errors: one clear sentence, printed by the CLI without a traceback; the exit
statuses; and what the CLI says of a bug."""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

EXIT_CHECK_FAILED = 1  # eaglet doctor found a failed check
EXIT_USAGE = 2  # an error the user can fix: a bad option, path, file or configuration
EXIT_INTERNAL = 70  # a bug in eaglet (sysexits' EX_SOFTWARE); the traceback goes to a log file
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM (128 + SIGINT), after saving the progress


class EagletError(Exception):
    """An error the user can cause and fix (bad path, bad config, bad value).

    The CLI prints ``str(err)`` on one line and exits with status 2.
    """


class Interrupted(EagletError):
    """A job stopped by a signal after saving its progress; the message says how to resume (exit 130).

    Here rather than in interrupt.py so that the rank launcher (parallel/) can raise it again
    in the launching process when rank 0 stopped this way.
    """


def internal_error(exc: BaseException, log_dir: Path) -> int:
    """A bug, not a user error: one sentence on screen, the traceback in a log file (or on screen if none)."""
    from eaglet import __version__

    text = "".join(traceback.format_exception(exc))
    try:
        log = log_dir / f"error-{time.strftime('%Y%m%d-%H%M%S')}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"eaglet {__version__}: {' '.join(sys.argv)}\n{text}")
        where = f"the traceback is in {log}"
    except OSError:
        print(text, file=sys.stderr, end="")
        where = "the traceback is above"
    first = (str(exc).splitlines() or [""])[0][:200]
    print(f"eaglet: internal error ({type(exc).__name__}: {first}), a bug in eaglet rather than in the input; "
          f"{where}; please report it", file=sys.stderr)
    return EXIT_INTERNAL
