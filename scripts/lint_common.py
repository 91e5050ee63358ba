"""What the lints of scripts/lint.sh share: the repository's root and the sources they read."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every source a comment may sit in (C++, CUDA, Python, shell, proto, CMake).
SOURCE_PATTERNS = ["*.h", "*.cc", "*.cu", "*.cuh", "*.py", "*.sh", "*.proto", "*.cmake", "CMakeLists.txt",
                   "*/CMakeLists.txt"]


def tree_sources(patterns, excluded):
    """The tracked and untracked-but-not-ignored files matching `patterns`, less those under the
    `excluded` folders, as absolute paths."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *patterns], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [os.path.join(ROOT, p) for p in sorted(set(out.split("\n")))
            if p and not p.startswith(excluded) and os.path.isfile(os.path.join(ROOT, p))]


def read_sources(argv, patterns, excluded, bad):
    """(path, shown name, text) of each file named in `argv`, else of the tree's sources; a file
    that cannot be read is appended to `bad`. Fixtures named in `argv` are shown as given."""
    for path in argv if argv else tree_sources(patterns, excluded):
        try:
            text = open(path, encoding="utf-8", errors="replace").read()
        except OSError as e:
            bad.append(f"{path}: cannot read: {e}")
            continue
        yield path, os.path.relpath(path, ROOT) if not argv else path, text
