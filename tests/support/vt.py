"""A small terminal for tests: what a person would see after a program's output, scroll-back included.
It knows what Rich's Live writes (text, CR, LF, cursor up, erase line and screen, home, SGR, cursor
visibility) and how a window that narrows re-wraps its rows."""

from __future__ import annotations

import re

_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


class Terminal:
    """A file a Console can write to, of `width` x `height` cells; `lines` is the scroll-back and the screen."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.rows: list[list[str]] = [[]]
        self.row = self.col = 0

    # -- the file a Console writes to ------------------------------------------------------------------
    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        raise OSError("a test terminal has no descriptor")

    def flush(self) -> None:
        pass

    def write(self, text: str) -> int:
        i = 0
        while i < len(text):
            match = _CSI.match(text, i) if text[i] == "\x1b" else None
            if match:
                self._control(match.group(1), match.group(2))
                i = match.end()
                continue
            self._char(text[i])
            i += 1
        return len(text)

    # -- what is on screen -----------------------------------------------------------------------------
    @property
    def top(self) -> int:
        """The first row still on screen: rows above it scrolled off and the cursor cannot reach them."""
        return max(0, len(self.rows) - self.height)

    @property
    def lines(self) -> list[str]:
        """Scroll-back and screen, trailing blanks dropped."""
        out = ["".join(r).rstrip() for r in self.rows]
        while out and not out[-1]:
            out.pop()
        return out

    @property
    def screen(self) -> list[str]:
        """What the window shows now: the rows from `top`, trailing blanks dropped."""
        return self.lines[self.top:]

    def _char(self, ch: str) -> None:
        if ch == "\n":  # a tty's output processing makes LF a new line at column 0
            self.row += 1
            self.col = 0
            if self.row == len(self.rows):
                self.rows.append([])
            return
        if ch == "\r":
            self.col = 0
            return
        if self.col >= self.width:  # automatic margins
            self._char("\n")
        line = self.rows[self.row]
        line.extend(" " * (self.col + 1 - len(line)))
        line[self.col] = ch
        self.col += 1

    def _control(self, params: str, final: str) -> None:
        n = int(params) if params.isdigit() else 1
        if final == "A":
            self.row = max(self.top, self.row - n)
        elif final == "B":
            self.row = min(len(self.rows) - 1, self.row + n)
        elif final == "G":
            self.col = n - 1
        elif final == "H" and not params:  # home: the screen's first cell
            self.row, self.col = self.top, 0
        elif final == "J" and params == "2":  # erase the screen (the scroll-back stays)
            for r in range(self.top, len(self.rows)):
                self.rows[r] = []
        elif final == "K" and params in ("2", "0", ""):
            line = self.rows[self.row]
            del line[0 if params == "2" else self.col:]
        # SGR colours (m), cursor visibility (?25h/l) and the like change nothing that is read here.

    def resize(self, width: int, height: int) -> None:
        """What tmux (and most terminals) do when the window narrows: each row longer than the new width
        wraps onto rows of its own; the cursor keeps its cell."""
        rows: list[list[str]] = []
        row = col = 0
        for i, line in enumerate(self.rows):
            chunks = [line[k:k + width] for k in range(0, len(line), width)] or [[]]
            if i == self.row:
                at = min(self.col // width, len(chunks) - 1) if width < self.width else 0
                row, col = len(rows) + at, self.col - at * width
            rows.extend(chunks)
        self.rows, self.row, self.col = rows, row, min(col, width)
        self.width, self.height = width, height
