"""Where the tests' files are, for every test folder alike: the checkout, the tests folder and the candidate
kernels the judge's tests feed it (tests/candidates/)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
CANDIDATES = TESTS / "candidates"
