#!/usr/bin/env python3
"""Fails when a C++ or CUDA function is longer than 80 lines.

A function is what the code analyzer lizard (PyPI `lizard`, pinned in scripts/setup.sh) finds in
C++ and CUDA: free functions, methods (in a class body or out of it), constructors, operators,
and a gtest test body (`TEST`, `TEST_F`, `TEST_P`: lizard reads the macro as a function). A
lambda counts as part of the function that holds it. Its length is lizard's `length`: the lines
from the one with the function's name to the one with its closing brace, both included, blank
lines and comments too (not lizard's NLOC, which leaves those out): what a reader has to go
through, and what an editor shows. Over 80 fails; 80 passes. The cure is to split it into named
steps, not to squeeze lines (docs/CONVENTIONS.md §6.12).

Without FILE arguments it checks the tracked and untracked-but-not-ignored *.h *.cc *.cu *.cuh of
the tree, less bench/ (benchmarks are scripts of measurements) and tests/data/; with them, those
files whatever their names, read as C++ (the lint's fixture test).

Runs with the project's virtual environment's Python, which has lizard (scripts/lint.sh finds
it); without lizard it fails, saying how to install it.
Usage: lint_function_length.py [FILE...]
"""
import sys

from lint_common import read_sources

PATTERNS = ["*.h", "*.cc", "*.cu", "*.cuh"]
EXCLUDED = ("bench/", "tests/data/")
MAX_LINES = 80
# gtest's macros, which lizard reports by the macro's name: shown with their arguments.
TEST_MACROS = {"TEST", "TEST_F", "TEST_P", "TYPED_TEST", "TYPED_TEST_P"}


def shown_name(fn):
    """`ns::Class::Method`, or `TEST_F(Suite, Name)` for a test body."""
    if fn.name.split("::")[-1] in TEST_MACROS:
        args = ", ".join(p.strip() for p in fn.full_parameters)
        return f"{fn.name.split('::')[-1]}({args})"
    return fn.name


def main(argv):
    try:
        import lizard  # pylint: disable=import-outside-toplevel
    except ImportError:
        print(f"lint: function length: the Python package lizard is missing from {sys.executable}; "
              "run scripts/setup.sh, which installs it into the project's virtual environment "
              "(~/.cache/oomb/venv, or $OOMB_VENV)", file=sys.stderr)
        return 1
    bad = []
    for _path, shown, text in read_sources(argv, PATTERNS, EXCLUDED, bad):
        # Named as C++ for lizard, whatever the file's name: .cu, .cuh and the fixtures' .txt too.
        info = lizard.analyze_file.analyze_source_code("source.cc", text)
        for fn in info.function_list:
            if fn.length > MAX_LINES:
                bad.append(f"{shown}:{fn.start_line}: function {shown_name(fn)} is {fn.length} lines "
                           f"(lines {fn.start_line}-{fn.end_line}), over {MAX_LINES}")
    for b in bad:
        print("lint:", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
