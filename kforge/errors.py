"""The one base class of errors the user can fix: its message is one line (what is wrong, where, what to
do), printed once by the CLI with exit code 2. Each package's own errors subclass it and keep their names,
so an error raised deep down reaches the user as it was written, without being re-wrapped on the way up."""

from __future__ import annotations


class UserError(ValueError):
    """Bad input or a setting that cannot work; the message is one line meant for the user."""
