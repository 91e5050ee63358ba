#!/usr/bin/env python3
"""Fails when a source file cites a Markdown file the repository does not have.

A citation is a name ending in `.md` made of letters, digits and `_ / . -` (a path such as
`docs/ARCHITECTURE.md` or a bare `README.md`), anywhere in the file: comments, strings, help
texts. It resolves when a file of that name exists relative to the repository root, to `docs/`,
or to the citing file's directory or one of its parents (so a bare `README.md` finds the
nearest one), and lies inside the repository. A leading `/` is taken from the root
(`SourceDir() + "/docs/metrics.md"`).

Not citations, and so not checked: a name followed by `(` or a word character (a method such
as `scratch.md()`), one after `$`, `{` or `}` (a shell variable's directory: `$out/load.md`), one
in a URL (`https://...`), one whose first directory is a placeholder in capitals
(`OUT_DIR/load.md`, an output the script writes), and `.md` alone (a glob's suffix).

Without FILE arguments it checks the tracked and untracked-but-not-ignored sources of the tree
(*.h *.cc *.cu *.cuh *.py *.sh *.proto *.cmake CMakeLists.txt, less bench/results/ and
tests/data/); with them, those files whatever their names (the lint's fixture test).
Usage: lint_doc_refs.py [FILE...]
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATTERNS = ["*.h", "*.cc", "*.cu", "*.cuh", "*.py", "*.sh", "*.proto", "*.cmake", "CMakeLists.txt",
            "*/CMakeLists.txt"]
EXCLUDED = ("bench/results/", "tests/data/")
NAME = re.compile(r"[A-Za-z0-9_./-]*\.md(?![A-Za-z0-9_(])")
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*/")


def tree_sources():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *PATTERNS], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [os.path.join(ROOT, p) for p in sorted(set(out.split("\n")))
            if p and not p.startswith(EXCLUDED) and os.path.isfile(os.path.join(ROOT, p))]


def is_citation(text, m):
    name = m.group(0)
    before = text[m.start() - 1] if m.start() > 0 else ""
    if before and before in "${}:":
        return False
    if name.startswith("//") or os.path.basename(name) == ".md" or PLACEHOLDER.match(name):
        return False
    return True


def resolves(name, citing_file):
    candidates = []
    if name.startswith("/"):
        candidates.append(os.path.join(ROOT, name.lstrip("/")))
    else:
        candidates += [os.path.join(ROOT, name), os.path.join(ROOT, "docs", name)]
        d = os.path.dirname(os.path.abspath(citing_file))
        while True:
            candidates.append(os.path.join(d, name))
            if d == ROOT or os.path.dirname(d) == d or not d.startswith(ROOT):
                break
            d = os.path.dirname(d)
    # Only files of this repository count: `../` out of it is a citation of something it lacks.
    inside = [os.path.normpath(c) for c in candidates]
    return any(c.startswith(ROOT + os.sep) and os.path.isfile(c) for c in inside)


def main(argv):
    files = argv if argv else tree_sources()
    bad = []
    for path in files:
        try:
            text = open(path, encoding="utf-8", errors="replace").read()
        except OSError as e:
            bad.append(f"{path}: cannot read: {e}")
            continue
        for m in NAME.finditer(text):
            if is_citation(text, m) and not resolves(m.group(0), path):
                line = text.count("\n", 0, m.start()) + 1
                shown = os.path.relpath(path, ROOT) if not argv else path
                bad.append(f"{shown}:{line}: cites {m.group(0)}, which the repository does not have")
    for b in bad:
        print("lint:", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
