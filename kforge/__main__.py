"""The `kforge` command's entry point (the console script's and `python -m kforge`'s).

Loading the command's modules (Typer, Rich, pydantic and the config schema) takes a second or two; a Ctrl-C
in that time would otherwise end in a traceback of the imports. Once loaded, `kforge.cli.app.main` answers
Ctrl-C itself."""

from __future__ import annotations

import signal
import sys


def main() -> None:
    try:
        from kforge.cli.app import main as run
    except KeyboardInterrupt:
        sys.exit(128 + signal.SIGINT)  # 130, as a shell reports a command Ctrl-C ended
    run()


if __name__ == "__main__":
    main()
