"""One-line command-line errors, shared by every `python -m specbench.<command>`.

A bad argument or input prints ONE line on stderr, `<prog>: error: <what>`, naming the argument, its
value and what is allowed, and the command exits 2 (argparse's own status for bad usage); no usage
dump, no traceback. `ArgumentParser` does it for argparse's errors, `int_at_least` for counts that
must reach a bound, and `run_main` for the errors a command finds once it reads its inputs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

USAGE_ERROR = 2  # exit status of every bad-input error (argparse's own)
INPUT_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError)


def one_line(message: object) -> str:
    """The message on one line (a multi-line exception text joined with '; ')."""
    return "; ".join(part.strip() for part in str(message).splitlines() if part.strip())


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line (`prog: error: message`, exit 2) without the usage dump."""

    def error(self, message: str):  # noqa: D102 (argparse's hook)
        self.exit(USAGE_ERROR, f"{self.prog}: error: {one_line(message)}\n")


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse `type`: an integer >= `low`; argparse prefixes the argument's name to the message."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: must be an integer >= {low}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value}: must be an integer >= {low}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def run_main(prog: str, main: Callable[[], int | None], errors: tuple = INPUT_ERRORS) -> int:
    """Run a command's body; an input error (`errors`) prints `prog: error: <message>` and returns 2."""
    try:
        return main() or 0
    except errors as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return USAGE_ERROR
