"""The `hyperplan` command line. Its entry point, `main`, imports the commands itself, so that Ctrl-C while Python
imports them (a second or more: onnx, numpy, scipy, the planner) ends as a running command's does, one line and
exit code 130 (`cli.errors.INTERRUPTED`), rather than a traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from cli.app import main as run
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    run()
