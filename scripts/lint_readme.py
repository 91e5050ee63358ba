#!/usr/bin/env python3
"""Fails when README.md is longer than 250 lines.

The README is the front page: what oomb is, the two set-up commands, how to use it, where the
rest is. Detail goes in the docs it points to (docs/*.md, client/README.md). A line is a line of
the file as `wc -l` counts them, plus a last line without a newline; blank lines count. Over 250
fails; 250 passes.

Without a FILE argument it checks the repository's README.md; with one, that file (the lint's
fixture test).
Usage: lint_readme.py [FILE]
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 250


def main(argv):
    path = argv[0] if argv else os.path.join(ROOT, "README.md")
    shown = path if argv else "README.md"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        print(f"lint: {shown}: cannot read: {e}", file=sys.stderr)
        return 1
    lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    if lines > MAX_LINES:
        print(f"lint: {shown}: {lines} lines, over {MAX_LINES}: move detail into the docs it points to",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
