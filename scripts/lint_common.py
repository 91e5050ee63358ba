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
