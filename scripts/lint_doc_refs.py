#!/usr/bin/env python3
"""Fails when a source file cites a Markdown file or a repository path that the repository lacks.

Two kinds of citation are checked, anywhere in the file: comments, strings, help texts.

Markdown files. A citation is a name ending in `.md` made of letters, digits and `_ / . -` (a
path such as `docs/ARCHITECTURE.md` or a bare `README.md`). It resolves when a file of that
name exists relative to the repository root, to `docs/`, or to the citing file's directory or
one of its parents (so a bare `README.md` finds the nearest one), and lies inside the
repository. A leading `/` is taken from the root
(`SourceDir() + "/docs/metrics.md"`).

Not citations, and so not checked: a name followed by `(` or a word character (a method such
as `scratch.md()`), one after `$`, `{` or `}` (a shell variable's directory: `$out/load.md`), one
in a URL (`https://...`), one whose first directory is a placeholder in capitals
(`OUT_DIR/load.md`, an output the script writes), and `.md` alone (a glob's suffix).

Repository paths. A citation is a name made of letters, digits and `_ / . -` that begins with one
of the repository's top-level folders and a `/` (`worker/job/executor.h`, `scripts/setup.sh`,
`tests/lint/missing_doc_ref.cc.txt`; the folders are the first components of the files git
knows, tracked or untracked-but-not-ignored) and ends in a source extension: .h .cc .cu .cuh
.py .sh .proto .cmake .txt .yaml .yml .json .md. It must exist relative to the repository root.
Not citations: a name that goes on after the extension with a letter, digit, `_ - (` or `.` and
a word character (`worker/x.h.in`: no listed extension ends it), one that follows a letter,
digit, `_ . / - $ { } * ~ @ %` (a path beneath another directory: `../worker/x.h`,
`${PROJECT_SOURCE_DIR}/scripts/lint.sh`, `$build/server/x.cc`, a URL's path), and a glob
(`tests/*/x.py`). A file generated at build time is cited without the folder it is generated
in, or beneath the build directory (`build/...`, which git does not know).

Without FILE arguments it checks the tracked and untracked-but-not-ignored sources of the tree
(*.h *.cc *.cu *.cuh *.py *.sh *.proto *.cmake CMakeLists.txt, less bench/results/ and
tests/data/); with them, those files whatever their names (the lint's fixture test).
Usage: lint_doc_refs.py [FILE...]
"""
import os
import re
import subprocess
import sys

from lint_common import ROOT, SOURCE_PATTERNS, read_sources

PATTERNS = SOURCE_PATTERNS
EXCLUDED = ("bench/results/", "tests/data/")
NAME = re.compile(r"[A-Za-z0-9_./-]*\.md(?![A-Za-z0-9_(])")
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*/")
EXTENSIONS = ["h", "cc", "cu", "cuh", "py", "sh", "proto", "cmake", "txt", "yaml", "yml", "json", "md"]


def top_level_folders():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return sorted({p.split("/")[0] for p in out.split("\n") if "/" in p})


def path_pattern(folders):
    """A repository path: a top-level folder, `/`, name characters, a listed extension, the end."""
    return re.compile(r"(?<![A-Za-z0-9_./$\-{}*~@%%])(?:%s)/[A-Za-z0-9_./-]*?\.(?:%s)(?![A-Za-z0-9_(-]|\.[A-Za-z0-9_])"
                      % ("|".join(re.escape(f) for f in folders), "|".join(EXTENSIONS)))


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
    paths = path_pattern(top_level_folders())
    bad = []
    for path, shown, text in read_sources(argv, PATTERNS, EXCLUDED, bad):
        reported = set()  # (line, name): a Markdown path that fails both checks is reported once
        for m in NAME.finditer(text):
            if is_citation(text, m) and not resolves(m.group(0), path):
                line = text.count("\n", 0, m.start()) + 1
                reported.add((line, m.group(0)))
                bad.append(f"{shown}:{line}: cites {m.group(0)}, which the repository does not have")
        for m in paths.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            if (line, m.group(0)) in reported or os.path.isfile(os.path.join(ROOT, m.group(0))):
                continue
            reported.add((line, m.group(0)))
            bad.append(f"{shown}:{line}: cites {m.group(0)}, which the repository does not have "
                       "(a path from a top-level folder is taken from the root)")
    for b in bad:
        print("lint:", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
