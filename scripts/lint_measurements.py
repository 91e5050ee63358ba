#!/usr/bin/env python3
"""Fails when a source file records history: a dated measurement, or a path into bench/results.

Measurements and their history belong in bench/results/<run>/README.md and docs/PERFORMANCE.md;
a source says what the code does and why, and names a measurement by the docs/PERFORMANCE.md
section that holds it, or the run by its topic ("the last-chunk run in bench/results"), without
its date or path (docs/CONVENTIONS.md §6.1). Two things count, anywhere in a file (comments,
strings, help texts):

- an ISO calendar date, 20YY-MM-DD (month 01-12, day 01-31), not preceded by a letter, digit,
  `_` or `.` nor followed by a digit (not part of a longer number or version); a run's date
  ("measured on YYYY-MM-DD", "the copy path until YYYY-MM-DD") and a run's
  directory name both carry one. Not counted: a date that is part of a timestamp (followed by
  `T` and a digit, or by a space and `HH:MM`), which is data, not history.
- a path into bench/results naming something in it: `bench/results/` followed by a name
  character (a letter, digit, `_ - *`), such as a run's directory or a glob of them. The folder
  itself, `bench/results` or `bench/results/` with nothing after it (or the end of a sentence),
  may be named: it says where the measurements live without quoting one.

Without FILE arguments it checks the tracked and untracked-but-not-ignored sources of the tree
(*.h *.cc *.cu *.cuh *.py *.sh *.proto *.cmake CMakeLists.txt, less bench/results/ and
tests/data/; Markdown is not checked); with them, those files whatever their names (the lint's
fixture test).
Usage: lint_measurements.py [FILE...]
"""
import re
import sys

from lint_common import SOURCE_PATTERNS, read_sources

PATTERNS = SOURCE_PATTERNS
EXCLUDED = ("bench/results/", "tests/data/")
DATE = re.compile(r"(?<![\w.])20\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?![\d]|T\d| \d\d:\d\d)")
RESULT = re.compile(r"bench/results/[A-Za-z0-9_*-][A-Za-z0-9_.*/-]*")


def main(argv):
    bad = []
    for _path, shown, text in read_sources(argv, PATTERNS, EXCLUDED, bad):
        for n, line in enumerate(text.split("\n"), 1):
            results = [m.group(0).rstrip(".") for m in RESULT.finditer(line)]
            # A date inside a cited result's name is reported as the result, once.
            dates = [m.group(0) for m in DATE.finditer(line) if not any(m.group(0) in r for r in results)]
            for r in results:
                bad.append(f"{shown}:{n}: names a measurement, {r}: name the docs/PERFORMANCE.md section "
                           "that holds it, or the run by its topic, not by its path")
            for d in dates:
                bad.append(f"{shown}:{n}: a date, {d}, in a source: dated measurements and history go in "
                           "bench/results/<run>/README.md and docs/PERFORMANCE.md")
    for b in bad:
        print("lint:", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
