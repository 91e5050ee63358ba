#!/usr/bin/env python3
"""README.md's code blocks as a test (issue 52), the way doctests keep docs honest.

    test_readme.py OOMBD OOMB README.md

Every fenced block of README.md (```bash, ```yaml, ```python, and any other or unlabelled fence)
is classified; a block this test does not know how to check fails it, naming its line, so that a
new block cannot go untested.

- yaml: a complete job spec (it has `model:`) is checked with the real `oomb submit FILE
  --validate-only` against a real `oombd serve` that this test starts on loopback, port 0, with a
  data dir of its own; a fragment (no `model:`, e.g. an `evaluation:` line) is merged into
  base_spec() and checked the same way. Absolute paths in a block are the README's placeholders:
  each must be in Env.placeholder_paths(), which maps it to a real file this test makes (or the
  test model); one that is not fails the test, naming it.
- bash: every command line (backslash continuations joined, `# comments` stripped, `;`
  separating commands) is run for real, with its placeholders substituted (substitute(): DIR,
  JOB, N, job.yaml and FILE_PLACEHOLDERS; `[optional parts]` run both with and without them;
  `a|b|c` runs each alternative) and with the sizes of SHRINK and SHRINK_SETS applied (CPU only,
  2 cores in CI). It must exit 0 and its output must pass the check of CHECKS for its
  subcommand; a subcommand without a check fails the test. Commands that cannot run inside a test
  are in NOT_RUN, each with why and how it is checked instead; comment-only lines must name only
  repository paths that exist.
- python: run with the venv's Python (this interpreter), HF_HUB_OFFLINE=1, CHECKPOINT_DIR and
  BASE_MODEL_DIR substituted by a LoRA checkpoint directory this test trained and the model.

Exit status: 0 (and "readme: ok" last) when every block passed; 1 when one failed (each failure
is named with its README line); 77 when the test data is absent (scripts/fetch_test_data.sh) or a
Python dependency is missing (the test skips).
"""
import glob
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:
    import yaml
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"readme: skipped: {e}")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.environ.get("OOMB_DATA_DIR", os.path.expanduser("~/.cache/oomb/data"))
SMOL = os.path.join(DATA, "models", "SmolLM2-135M-Instruct")
AUSTEN = os.path.join(DATA, "texts", "austen")

# CI's sizes (CPU only, 2 cores): the value an option takes instead of the README's. Only token
# counts and lengths, suite sizes and step counts; nothing else of a command changes.
SHRINK = {
    "--tokens": ["512"],            # oombd data build: 65536-token samples -> 512
    "--lengths": ["256"],           # passkey / needle documents: 8192 ... 65536 tokens -> 256
    "--max-tokens": ["256"],        # oombd model eval --max-tokens N
    "--max-new-tokens": ["8"],      # oombd model generate: 64 -> 8
    "--depths": ["2"],              # 5 or 9 depths -> 2
    "--trials": ["1"],              # 4 trials -> 1
}
# --set values, and the --set added to the commands that train (oomb submit --watch, oombd run).
# `oomb estimate job.yaml --set data.max_seq_len=1048576` runs shrunk (it must fit: exit 0) and as
# written (a plan, no compute: it fits, or, on a machine too small, exits 1 naming the longest
# context that fits).
SHRINK_SETS = {"training.max_steps": "1", "data.max_seq_len": "512"}
TRAINING_SETS = ["training.max_steps=1", "data.max_seq_len=512"]


def fail(msg):
    raise CheckError(msg)


class CheckError(Exception):
    pass


# --- README parsing ------------------------------------------------------------------------------

FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")


def fenced_blocks(text):
    """(line of the opening fence, language, content lines, line of the first content line)."""
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3).lower()
        start = i + 1
        body, i = [], i + 1
        closed = False
        while i < len(lines):
            s = lines[i].strip()
            if s and set(s) == {fence[0]} and len(s) >= len(fence):
                closed = True
                break
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        if not closed:
            raise CheckError(f"README.md:{start}: unterminated {fence} block")
        blocks.append((start, lang, body, start + 1))
        i += 1
    return blocks


def split_comment(line):
    """(code, comment) of one shell line: `#` at a word's start, outside quotes, starts a comment."""
    quote = None
    for k, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k].rstrip(), line[k + 1:].strip()
    return line.rstrip(), ""


def logical_lines(body, first_line):
    """[(line, code, comment)]: continuations joined; comment-only lines keep their comment."""
    out, code, comments, start = [], "", [], None
    for k, raw in enumerate(body):
        c, comment = split_comment(raw)
        if start is None:
            start = first_line + k
        if comment:
            comments.append(comment)
        if c.endswith("\\"):
            code += c[:-1] + " "
            continue
        code += c
        out.append((start, code.strip(), " ".join(comments)))
        code, comments, start = "", [], None
    if code.strip():
        out.append((start, code.strip(), " ".join(comments)))
    return [x for x in out if x[1] or x[2]]


def split_commands(code):
    """`a; b && c` -> ["a", "b", "c"] (outside quotes)."""
    parts, cur, quote, k = [], "", None, 0
    while k < len(code):
        c = code[k]
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == ";" or code.startswith("&&", k):
            parts.append(cur.strip())
            cur = ""
            k += 2 if c == "&" else 1
            continue
        cur += c
        k += 1
    parts.append(cur.strip())
    return [p for p in parts if p]


def variants(tokens):
    """The command with every `[optional part]` included, and (if any) with none of them."""
    full, bare, depth, has = [], [], 0, False
    for t in tokens:
        opens, closes = t.startswith("["), t.endswith("]")
        word = t[1 if opens else 0:len(t) - (1 if closes else 0)]
        if opens:
            depth += 1
            has = True
        if word:
            full.append(word)
            if depth == 0:
                bare.append(word)
        if closes:
            depth -= 1
    if depth != 0:
        fail(f"unbalanced [ ] in `{' '.join(tokens)}`")
    return [full, bare] if has else [full]


# --- the environment: files, the daemon, lazily made jobs and adapters -----------------------------

def paragraphs(path, lo=300, hi=900):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return [p for p in paras if lo <= len(p) <= hi]


def read_chars(path, n, skip=20000):
    with open(path, encoding="utf-8") as f:
        return f.read()[skip:skip + n]


class Env:
    def __init__(self, oombd, oomb, tmp):
        self.oombd, self.oomb, self.tmp = oombd, oomb, tmp
        self.files = os.path.join(tmp, "files")      # job inputs and command outputs (cwd)
        self.data_dir = os.path.join(tmp, "data")    # the daemon's (jobs may not read it)
        os.makedirs(self.files)
        self.daemon = None
        self.endpoint = None
        self._job = None          # the trained job: (id, its final checkpoint path)
        self._adapter = None      # a PEFT adapter directory outside the daemon's data dir
        self.job_yaml_text = None  # the README's example spec, paths mapped
        # The caller's oomb settings (a token, an endpoint, configuration variables) left out.
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("OOMB_TOKEN", "OOMB_ENDPOINT", "OOMB_DATA_HOME") and not re.match(r"OOMB_[A-Z]+__", k)}
        self.env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", NO_COLOR="1", TOKENIZERS_PARALLELISM="false")
        self._make_files()

    def path(self, name):
        return os.path.join(self.files, name)

    def _make_files(self):
        def jsonl(name, texts):
            with open(self.path(name), "w", encoding="utf-8") as f:
                for t in texts:
                    f.write(json.dumps({"text": t}) + "\n")
        jsonl("austen.jsonl", paragraphs(os.path.join(AUSTEN, "emma.txt"))[:12])
        jsonl("heldout.jsonl", paragraphs(os.path.join(AUSTEN, "persuasion.txt"))[:4])
        jsonl("f.jsonl", paragraphs(os.path.join(AUSTEN, "prideprejudice.txt"))[:2])
        with open(self.path("book.txt"), "w", encoding="utf-8") as f:
            f.write(read_chars(os.path.join(AUSTEN, "northangerabbey.txt"), 30000))
        with open(self.path("long.txt"), "w", encoding="utf-8") as f:
            f.write(read_chars(os.path.join(AUSTEN, "mansfieldpark.txt"), 3000))
        os.makedirs(self.path("books"))
        for novel in ("sensesensibility", "persuasion"):
            with open(os.path.join(self.path("books"), novel + ".txt"), "w", encoding="utf-8") as f:
                f.write(read_chars(os.path.join(AUSTEN, novel + ".txt"), 12000))

    # The README's placeholder paths (in its YAML blocks) -> real files. Values are functions: the
    # adapter is made when first needed.
    def placeholder_paths(self):
        return {
            "/home/me/models/SmolLM2-135M-Instruct": lambda: SMOL,
            "/models/SmolLM2-135M-Instruct": lambda: SMOL,
            "/home/me/data/austen.jsonl": lambda: self.path("austen.jsonl"),
            "/data/heldout.jsonl": lambda: self.path("heldout.jsonl"),
            "/runs/austen/final": self.adapter,
        }

    def map_paths(self, text, doc):
        """`text` (a YAML block) with its placeholder paths replaced; fails on an unknown one."""
        table = self.placeholder_paths()
        for s in strings(doc):
            if s.startswith("/") and s not in table:
                fail(f"placeholder path {s} is not in test_readme.py's table (Env.placeholder_paths)")
        # One pass, longest first, whole paths only (a replacement is never replaced again).
        rx = "|".join(re.escape(k) for k in sorted(table, key=len, reverse=True))
        return re.sub(rf"(?<![\w./-])({rx})(?![\w./-])", lambda m: table[m.group(1)](), text)

    # --- processes
    def run(self, argv, stdin=None, timeout=300, check=True):
        t0 = time.time()
        try:
            p = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=self.files, env=self.env,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            fail(f"`{shlex.join(argv)}` ran past {timeout} s")
        p.seconds = time.time() - t0
        if check and p.returncode != 0:
            fail(f"`{shlex.join(argv)}` exited {p.returncode}:\n{tail(p.stdout)}{tail(p.stderr)}")
        return p

    def start_daemon(self):
        env = dict(self.env, OOMB_DATA_HOME=self.data_dir, OOMB_SERVER__LISTEN="127.0.0.1:0",
                   OOMB_METRICS__LISTEN="127.0.0.1:0",
                   OOMB_HTTP__LISTEN="127.0.0.1:0")
        os.makedirs(self.data_dir, mode=0o700)
        self.log = open(os.path.join(self.tmp, "oombd.log"), "w")
        self.daemon = subprocess.Popen([self.oombd, "serve"], stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                       cwd=self.tmp)
        port_file = os.path.join(self.data_dir, "oombd.port")
        deadline = time.time() + 60
        while time.time() < deadline:
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            if self.daemon.poll() is not None:
                fail(f"oombd serve exited {self.daemon.returncode}:\n{self.daemon_log()}")
            time.sleep(0.1)
        else:
            fail(f"oombd serve wrote no {port_file} in 60 s:\n{self.daemon_log()}")
        self.endpoint = "127.0.0.1:" + open(port_file).read().strip()
        self.env["OOMB_ENDPOINT"] = self.endpoint
        self.run([self.oomb, "health"])

    def daemon_log(self):
        self.log.flush()
        with open(os.path.join(self.tmp, "oombd.log")) as f:
            return tail(f.read(), 3000)

    def stop_daemon(self):
        if self.daemon and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(60)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()

    def job_state(self, job):
        p = self.run([self.oomb, "get", job, "-o", "json"])
        return json.loads(p.stdout)["state"]

    def wait_state(self, job, states, timeout=180):
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.job_state(job)
            if s in states:
                return s
            time.sleep(0.25)
        fail(f"job {job} did not reach {'/'.join(states)} in {timeout} s (it is {s})")

    # --- fixtures made when first needed (normally by the README's own commands)
    def job_yaml(self):
        if self.job_yaml_text is None:
            fail("the README has no complete job spec (a ```yaml block with model:) for job.yaml")
        p = self.path("job.yaml")
        if not os.path.exists(p):
            with open(p, "w") as f:
                f.write(self.job_yaml_text)
        return p

    def trained_job(self):
        """A job trained by the daemon (README's `oomb submit job.yaml --watch`, shrunk)."""
        if self._job is None:
            argv = [self.oomb, "submit", self.job_yaml(), "--watch"] + sum((["--set", s] for s in TRAINING_SETS), [])
            self.register_trained_job(self.run(argv))
        return self._job[0]

    def register_trained_job(self, p):
        job = job_id(p.stdout)
        if not job:
            fail(f"`oomb submit --watch` printed no job name first:\n{tail(p.stdout)}")
        state = self.job_state(job)
        if state != "SUCCEEDED":
            fail(f"the submitted job {job} is {state}, not SUCCEEDED")
        cps = json.loads(self.run([self.oomb, "checkpoints", job, "-o", "json"]).stdout).get("checkpoints", [])
        final = [c["path"] for c in cps if c.get("final")]
        if not final or not os.path.isfile(os.path.join(final[-1], "adapter_model.safetensors")):
            fail(f"job {job} lists no final LoRA checkpoint: {cps}")
        self._job = (job, final[-1])

    def checkpoint_dir(self):
        """CHECKPOINT_DIR of the README's Python: the trained job's, holding final/."""
        self.trained_job()
        return os.path.dirname(self._job[1])

    def adapter(self):
        """A PEFT adapter outside the daemon's data dir: `oombd run`'s final/ (README's, or one)."""
        if self._adapter is None:
            argv = [self.oombd, "run", self.job_yaml(), "--checkpoint-dir", self.path("adapter-run")]
            self.register_adapter(self.run(argv + sum((["--set", s] for s in TRAINING_SETS), [])))
        return self._adapter

    def register_adapter(self, p):
        out = p.stdout.strip().split("\n")[-1] if p.stdout.strip() else ""
        for f in ("adapter_model.safetensors", "adapter_config.json", "base_config.json"):
            if not os.path.isfile(os.path.join(out, f)):
                fail(f"`oombd run` printed {out!r}, which has no {f}")
        self._adapter = out


def job_id(out):
    """The job id of a job name (`jobs/ID`, or with a parent, `.../jobs/ID`) first on `out`."""
    m = re.match(r"\s*(?:\S*/)?jobs/([a-z0-9][a-z0-9-]*)(?:\s|$)", out)
    return m.group(1) if m else None


def strings(doc):
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for v in doc.values():
            yield from strings(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from strings(v)


def tail(s, n=1500):
    s = s or ""
    return ("..." + s[-n:] if len(s) > n else s) + ("" if s.endswith("\n") or not s else "\n")


# --- yaml blocks ---------------------------------------------------------------------------------

def base_spec(env):
    """What a fragment (no model:) is merged into: the test model, training and validation data."""
    return {"model": {"path": SMOL},
            "data": {"train": env.path("austen.jsonl"), "validation": env.path("heldout.jsonl"),
                     "max_seq_len": 65536}}


def merge(base, extra):
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merge(base[k], v)
        else:
            base[k] = v
    return base


def check_yaml(env, line, body):
    text = "\n".join(body) + "\n"
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        fail(f"not YAML: {e}")
    if not isinstance(doc, dict):
        fail("a YAML block that is not a mapping (neither a job spec nor a fragment of one)")
    if "model" in doc:
        spec, what = env.map_paths(text, doc), "job spec"
    else:
        env.map_paths(text, doc)  # a fragment's paths are placeholders too
        mapped = yaml.safe_load(env.map_paths(text, doc))
        spec, what = yaml.safe_dump(merge(base_spec(env), mapped), sort_keys=False), "fragment, merged into a base spec"
    f = env.path(f"readme-{line}.yaml")
    with open(f, "w") as out:
        out.write(spec)
    p = env.run([env.oomb, "submit", f, "--validate-only"], check=False)
    if p.returncode != 0 or p.stdout.strip() != "valid":
        fail(f"`oomb submit {f} --validate-only` exited {p.returncode}:\n{tail(p.stdout)}{tail(p.stderr)}")
    warnings = [w for w in p.stderr.split("\n") if w.startswith("warning:")]
    return f"validated: {what}" + (f"; {len(warnings)} warning(s): {warnings[0][:100]}" if warnings else "")


# --- bash blocks ---------------------------------------------------------------------------------

# Commands that cannot run inside this test: why, and how each is checked instead.
def _exists(*paths):
    for p in paths:
        if not os.path.exists(os.path.join(ROOT, p)):
            fail(f"{p} does not exist")


def _registered(name, script):
    """ctest test `name` runs `script` (tests/CMakeLists.txt or a subfolder's)."""
    for f in glob.glob(os.path.join(ROOT, "tests", "**", "CMakeLists.txt"), recursive=True):
        with open(f) as fh:
            if re.search(rf"add_test\(NAME {re.escape(name)}\s[^)]*{re.escape(script)}", fh.read()):
                return
    fail(f"no ctest test {name} runs {script}")


def _not_run_demo(env, m):
    _exists("scripts/demo.sh", "tests/smoke/demo_test.sh")
    _registered("demo", "demo_test.sh")
    return "skipped: runs as its own ctest test demo (tests/smoke/demo_test.sh, registered); scripts/demo.sh exists"


def _not_run_test(env, m):
    _exists("scripts/test.sh")
    _registered("readme_commands_run", "test_readme.py")
    return "skipped: the command that runs every test, this one (readme_commands_run) too; scripts/test.sh exists"


def _not_run_prometheus(env, m):
    cfg = m.group(1)
    _exists(cfg)
    promtool = shutil.which("promtool")
    if not promtool:
        return f"skipped: a server; promtool absent, {cfg} exists"
    p = subprocess.run([promtool, "check", "config", cfg], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"promtool check config {cfg} exited {p.returncode}:\n{tail(p.stdout)}{tail(p.stderr)}")
    return f"skipped: a server; `promtool check config {cfg}` passes"


def _not_run_serve(env, m):
    env.run([env.oomb, "health"])
    # The defaults its comment states, from `oombd config print` without this test's settings.
    p = subprocess.run([env.oombd, "config", "print"], env=env.env, capture_output=True, text=True, cwd=env.files)
    cfg = yaml.safe_load(p.stdout) if p.returncode == 0 else {}
    want = {("server", "listen"): "127.0.0.1:7070", ("metrics", "listen"): "127.0.0.1:7071",
            ("server", "data_dir"): os.path.expanduser("~/.local/share/oomb")}
    for (section, key), value in want.items():
        got = (cfg.get(section) or {}).get(key)
        if got != value:
            fail(f"the comment says {section}.{key} defaults to {value}; `oombd config print` says {got!r}")
    return ("skipped: started by this test (OOMB_SERVER__LISTEN=127.0.0.1:0, its own data dir); oomb health ok; "
            "the defaults of its comment match `oombd config print`")


NOT_RUN = [
    (re.compile(r"^bash scripts/demo\.sh$"), _not_run_demo),
    (re.compile(r"^bash scripts/test\.sh$"), _not_run_test),
    (re.compile(r"^prometheus --config\.file=(\S+)$"), _not_run_prometheus),
    (re.compile(r"^oombd serve$"), _not_run_serve),
]


def check_comment_only(env, comment):
    """A comment-only line (the Grafana instructions): the repository paths it names exist, and the
    dashboard directory it names is the one deploy/grafana's provisioning loads."""
    checked = []
    for p in re.findall(r"(?<![\w/])((?:deploy|scripts|docs|tests)/[\w./*-]+)", comment):
        p = p.rstrip(".,")
        if not glob.glob(os.path.join(ROOT, p)):
            fail(f"the comment names {p}, which does not exist")
        checked.append(p)
    if "grafana" in comment.lower():
        with open(os.path.join(ROOT, "deploy/grafana/dashboards/oomb.json")) as f:
            json.load(f)
        with open(os.path.join(ROOT, "deploy/grafana/provisioning/dashboards/oomb.yml")) as f:
            want = yaml.safe_load(f)["providers"][0]["options"]["path"].rstrip("/")
        named = [d.rstrip("/") for d in re.findall(r"(/var/lib/grafana/\S+)", comment)]
        if named and want not in named:
            fail(f"the dashboards go to {named[0]}, but deploy/grafana's provisioning loads {want}")
        checked.append("oomb.json parses")
    return checked


class Cmd:
    """One command as run: argv (binary resolved), stdin, its README text."""

    def __init__(self, program, args, stdin=None):
        self.program, self.args, self.stdin = program, args, stdin

    def sub(self):
        """The subcommand, e.g. `submit`, `model eval`, `config print`."""
        a = [x for x in self.args]
        if self.program == "oombd" and a and a[0] in ("model", "data", "config") and len(a) > 1:
            return f"{a[0]} {a[1]}"
        return a[0] if a else ""

    def opt(self, name):
        return name in self.args

    def value(self, name):
        i = self.args.index(name)
        return self.args[i + 1]

    def text(self):
        return ("echo ... | " if self.stdin is not None else "") + shlex.join([self.program] + self.args)


FILE_PLACEHOLDERS = ["job.yaml", "f.jsonl", "book.txt", "long.txt", "books/", "train.jsonl", "passkey-train.jsonl"]
FILELIKE = re.compile(r"^[\w.-]+\.(ya?ml|jsonl?|txt|safetensors|gguf)$|^[\w.-]+/$")


def substitute(env, program, args, job_for, shrink=True):
    """README placeholders -> real values, sizes -> CI's (SHRINK, SHRINK_SETS) if `shrink`."""
    out, k = [], 0
    sub = args[0] if args else ""
    while k < len(args):
        t, prev = args[k], (args[k - 1] if k else "")
        if t == "DIR":
            out.append(env.adapter() if prev == "--adapter" else SMOL)
        elif t == "JOB":
            out.append(job_for())
        elif t == "N" and prev in SHRINK:
            out.append(SHRINK[prev][0])
        elif t == "job.yaml":
            out.append(env.job_yaml())
        elif t in FILE_PLACEHOLDERS:
            out.append(env.path(t.rstrip("/")))
        elif re.fullmatch(r"[A-Z][A-Z0-9_]*", t):
            fail(f"placeholder {t} is not in test_readme.py's table (DIR, JOB, N, {', '.join(FILE_PLACEHOLDERS)})")
        elif FILELIKE.match(t) and not os.path.exists(os.path.join(ROOT, t)):
            fail(f"placeholder file {t} is not in test_readme.py's table ({', '.join(FILE_PLACEHOLDERS)})")
        elif t in SHRINK and shrink:
            out.append(t)
            k += 1
            while k < len(args) and re.fullmatch(r"\d+|N", args[k]):
                k += 1
            out.extend(SHRINK[t])
            continue
        elif prev == "--set" and shrink and t.split("=", 1)[0] in SHRINK_SETS:
            out.append(t.split("=", 1)[0] + "=" + SHRINK_SETS[t.split("=", 1)[0]])
        else:
            out.append(t)
        k += 1
    # The commands that train: CI's steps and length.
    trains = (program == "oomb" and sub == "submit" and "--watch" in out) or (program == "oombd" and sub == "run")
    if shrink and trains:
        have = {out[i + 1].split("=", 1)[0] for i in range(len(out) - 1) if out[i] == "--set"}
        for s in TRAINING_SETS:
            if s.split("=", 1)[0] not in have:
                out += ["--set", s]
    return out


def _json(p, what="stdout"):
    try:
        return json.loads(p.stdout)
    except ValueError:
        fail(f"{what} is not JSON:\n{tail(p.stdout)}")


def check_submit(env, c, p):
    if c.opt("--validate-only"):
        if p.stdout.strip() != "valid":
            fail(f"printed {p.stdout.strip()!r}, not 'valid'")
        return "valid"
    if c.opt("--watch"):
        env.register_trained_job(p)
        return f"job {env._job[0]} SUCCEEDED, final checkpoint {env._job[1]}"
    if not job_id(p.stdout):
        fail(f"printed no job name:\n{tail(p.stdout)}")
    return p.stdout.split()[0]


def check_list(env, c, p):
    if c.opt("-o") and c.value("-o") == "json":
        jobs = _json(p).get("jobs", [])
        names = [j.get("name") for j in jobs]
        if env.trained_job() not in [job_id(n or "") for n in names]:
            fail(f"the trained job is not listed: {names}")
        return f"JSON, {len(jobs)} job(s)"
    if "NAME" not in p.stdout:
        fail(f"no table:\n{tail(p.stdout)}")
    return "table"


def check_get(env, c, p):
    if "SUCCEEDED" not in p.stdout or "checkpoints:" not in p.stdout:
        fail(f"no state SUCCEEDED / checkpoints line:\n{tail(p.stdout)}")
    m = re.search(r"^loss: +([▁-█]+)  \d", p.stdout, re.M)
    if not m:
        fail(f"no loss sparkline:\n{tail(p.stdout)}")
    return f"state SUCCEEDED, loss {m.group(1)}"


def check_plot(env, c, p):
    """The SVG `oomb plot` wrote, rendered to pixels by cairosvg and opened by Pillow: its size,
    and the loss curve's colour drawn."""
    import io

    import cairosvg
    from PIL import Image
    path = os.path.join(env.files, p.stdout.strip())
    try:
        image = Image.open(io.BytesIO(cairosvg.svg2png(url=path))).convert("RGB")
    except Exception as e:  # noqa: BLE001 - any failure to render is the check's failure
        fail(f"{path} does not render as an image: {e}")
    loss_pixels = sum(1 for r, g, b in image.getdata()  # the loss curve's colour, #1f77b4 (antialiased)
                      if abs(r - 31) + abs(g - 119) + abs(b - 180) < 60)
    if image.size != (960, 640) or loss_pixels < 50:
        fail(f"{path}: {image.size[0]}x{image.size[1]}, {loss_pixels} pixels of the loss curve's colour")
    return f"{os.path.basename(path)} renders as a {image.size[0]}x{image.size[1]} image, loss curve drawn"


def check_events(env, c, p):
    if "SUCCEEDED" not in p.stdout or "step" not in p.stdout.lower():
        fail(f"no step and SUCCEEDED events:\n{tail(p.stdout)}")
    return f"{len(p.stdout.strip().splitlines())} events"


def check_logs(env, c, p):
    for what in ("info  model: ", "info  plan: chunks of ", "info  state SUCCEEDED"):
        if what not in p.stdout:
            fail(f"no '{what}' line:\n{tail(p.stdout)}")
    return f"{len(p.stdout.strip().splitlines())} log lines"


def check_datasets(env, c, p):
    name = p.stdout.strip()
    if not re.fullmatch(r"projects/[a-z0-9-]+/datasets/ds-[0-9a-f]{12}", name):
        fail(f"printed no dataset name:\n{tail(p.stdout)}")
    return name


def check_download(env, c, p):
    d = p.stdout.strip()
    if not os.path.isfile(os.path.join(d, "adapter_model.safetensors")):
        fail(f"no adapter_model.safetensors in the directory printed:\n{tail(p.stdout)}")
    return f"{d} holds the adapter"


def check_checkpoints(env, c, p):
    if env._job[1] not in p.stdout or "PeftModel" not in p.stdout:
        fail(f"neither the final checkpoint {env._job[1]} nor its loading code:\n{tail(p.stdout)}")
    return "final checkpoint and its loading code"


def check_estimate(env, c, p):
    for want in ("fits                yes", "longest context", "chosen"):
        if want not in p.stdout:
            fail(f"no {want!r} in:\n{tail(p.stdout)}")
    m = re.search(r"longest context\s+(\d+) tokens", p.stdout)
    detail = f"fits; longest context {m.group(1) if m else '?'} tokens"
    if c.unshrunk == c.args:
        return detail
    # As written: it fits (exit 0), or it does not on this machine (exit 1, the plan and its limit).
    q = env.run([env.oomb] + c.unshrunk, check=False)
    fits = "fits                yes" in q.stdout
    if not ((q.returncode == 0 and fits) or (q.returncode == 1 and "fits                no" in q.stdout
                                               and re.search(r"^limit: .*the longest context that fits is \d+",
                                                             q.stdout, re.M))):
        fail(f"as written, `oomb {shlex.join(c.unshrunk)}` exited {q.returncode}:\n{tail(q.stdout)}{tail(q.stderr)}")
    m = re.search(r"longest context\s+(\d+) tokens", q.stdout)
    return detail + ("; as written: fits" if fits else
                     f"; as written: does not fit this machine (exit 1), longest context {m.group(1)} tokens")


def check_run(env, c, p):
    env.register_adapter(p)
    return f"adapter {env._adapter}"


def check_inspect(env, c, p):
    if c.opt("-o"):
        j = _json(p)
        if j.get("model_type") != "llama" or not j.get("parameters"):
            fail(f"unexpected: {p.stdout[:300]}")
        return f"JSON, {j['parameters']} parameters"
    if not re.search(r"^architecture: \S+", p.stdout, re.M) or "context_window" not in p.stdout:
        fail(f"no architecture / context_window lines:\n{tail(p.stdout)}")
    return "text"


def check_eval(env, c, p):
    j = _json(p)
    suites = [c.args[i + 1] for i, a in enumerate(c.args) if a == "--suite"] or ["loss"]
    got = []
    for s in suites:
        if s == "loss":
            if not (isinstance(j.get("loss"), float) and math.isfinite(j["loss"]) and j["loss"] > 0):
                fail(f"no finite loss: {p.stdout[:300]}")
            got.append(f"loss {j['loss']:.4f} over {j.get('tokens')} tokens")
        elif s == "positions":
            buckets = (j.get("positions") or {}).get("buckets")
            if not buckets:
                fail(f"no positions buckets: {p.stdout[:300]}")
            got.append(f"{len(buckets)} position buckets")
        else:
            r = j.get(s)
            if not isinstance(r, dict) or "accuracy" not in r or not r.get("cells"):
                fail(f"no {s} accuracy and cells: {p.stdout[:300]}")
            got.append(f"{s} {r['accuracy']:.2f} ({len(r['cells'])} cells)")
    return ", ".join(got)


def check_generate(env, c, p):
    j = _json(p)
    n = int(c.value("--max-new-tokens")) if c.opt("--max-new-tokens") else 16
    if not j.get("prompt_ids") or not 0 < len(j.get("new_ids", [])) <= n or not isinstance(j.get("text"), str):
        fail(f"unexpected: {p.stdout[:300]}")
    return f"{len(j['prompt_ids'])} prompt tokens, {len(j['new_ids'])} new"


def check_data(env, c, p):
    j = _json(p)
    out = c.value("-o")
    if not j.get("samples") or not os.path.isfile(out):
        fail(f"no samples or no {out}: {p.stdout[:300]}")
    with open(out) as f:
        lines = [json.loads(x) for x in f]
    if len(lines) != j["samples"]:
        fail(f"{out} has {len(lines)} lines, the command said {j['samples']}")
    if c.sub() == "data retrieval":
        want = len(SHRINK["--lengths"]) * int(SHRINK["--depths"][0])
        if len(lines) != want or "input_ids" not in lines[0] or "labels" not in lines[0]:
            fail(f"{out}: {len(lines)} samples of {sorted(lines[0])}, expected {want} of input_ids, labels")
        # The samples train: validated as a job's data.train.
        spec = env.path("retrieval-job.yaml")
        with open(spec, "w") as f:
            yaml.safe_dump({"model": {"path": SMOL}, "data": {"train": out, "max_seq_len": 512}}, f)
        env.run([env.oomb, "submit", spec, "--validate-only"])
        return f"{len(lines)} samples; valid as data.train"
    if "text" not in lines[0]:
        fail(f"{out}: no text field")
    return f"{len(lines)} samples, {j.get('tokens')} tokens"


def check_tokenize(env, c, p):
    try:
        ids = json.loads(p.stdout)
    except ValueError:
        ids = None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        fail(f"no JSON list of ids: {p.stdout[:200]}")
    # `# and --decode`: the ids back to the text.
    d = env.run([env.oombd] + c.args + ["--decode"], stdin=p.stdout)
    if d.stdout.strip() != (c.stdin or "").strip():
        fail(f"--decode gave {d.stdout.strip()!r}, not {(c.stdin or '').strip()!r}")
    return f"ids {ids}; --decode gives {d.stdout.strip()!r}"


def check_config_print(env, c, p):
    try:
        cfg = yaml.safe_load(p.stdout)
    except yaml.YAMLError as e:
        fail(f"not YAML: {e}")
    if not isinstance(cfg, dict) or "server" not in cfg:
        fail(f"no server section:\n{tail(p.stdout)}")
    return f"sections {', '.join(cfg)}"


CHECKS = {
    ("oomb", "submit"): check_submit,
    ("oomb", "list"): check_list,
    ("oomb", "get"): check_get,
    ("oomb", "events"): check_events,
    ("oomb", "logs"): check_logs,
    ("oomb", "plot"): check_plot,
    ("oomb", "checkpoints"): check_checkpoints,
    ("oomb", "datasets"): check_datasets,
    ("oomb", "download"): check_download,
    ("oomb", "estimate"): check_estimate,
    ("oombd", "run"): check_run,
    ("oombd", "model inspect"): check_inspect,
    ("oombd", "model eval"): check_eval,
    ("oombd", "model generate"): check_generate,
    ("oombd", "data build"): check_data,
    ("oombd", "data retrieval"): check_data,
    ("oombd", "tokenize"): check_tokenize,
    ("oombd", "config print"): check_config_print,
}

# `oomb cancel|pause|resume|delete JOB`: each verb in turn on a job of its own, in the order its
# states allow, and the state each leads to.
VERB_ORDER = ["pause", "resume", "cancel", "delete"]
VERB_STATES = {"pause": {"PAUSED"}, "resume": {"QUEUED", "RUNNING"}, "cancel": {"CANCELLED"}, "delete": None}


def run_verbs(env, line, verbs, rest):
    job = "readme-verbs"
    argv = [env.oomb, "submit", env.job_yaml(), "--job-id", job, "--set", "training.max_steps=1000",
            "--set", "data.max_seq_len=256", "--set", "memory.chunk_tokens=128", "--set", "display_name=readme-verbs"]
    env.run(argv)
    done = []
    for v in sorted(verbs, key=lambda v: VERB_ORDER.index(v) if v in VERB_ORDER else 99):
        if v not in VERB_STATES:
            fail(f"no check for `oomb {v}`; add it to test_readme.py's VERB_STATES")
        args = [v] + [job if t == "JOB" else t for t in rest]
        if "JOB" not in rest:
            fail(f"`oomb {v}` without JOB")
        p = env.run([env.oomb] + args)
        if v == "delete":
            g = env.run([env.oomb, "get", job], check=False)
            if g.returncode != 3:
                fail(f"after delete, `oomb get {job}` exited {g.returncode}, not 3 (not found)")
            done.append("delete -> not found")
        else:
            if not p.stdout.strip():
                fail(f"`oomb {v}` printed nothing")
            done.append(f"{v} -> {env.wait_state(job, VERB_STATES[v])}")
    print(f"  README.md:{line}: ran: oomb {'|'.join(verbs)} {' '.join(rest)}: {', '.join(done)}")


def check_bash(env, line, body):
    """Every line of the block, failed or not; then the failures, each with its line."""
    ran, other, failed = 0, [], []
    for ln, code, comment in logical_lines(body, line + 1):
        try:
            if not code:
                checked = check_comment_only(env, comment)
                print(f"  README.md:{ln}: comment only" + (f"; checked {', '.join(checked)}" if checked else ""))
                continue
            for cmd in split_commands(code):
                ran += run_command(env, ln, cmd, other)
        except CheckError as e:
            print(f"  README.md:{ln}: FAILED: {e}", flush=True)
            failed.append(f"README.md:{ln}: {e}")
    if failed:
        raise CheckError("\n  ".join(failed))
    what = [f"ran {ran} command(s)"] if ran else []
    return "; ".join(what + other) or "comments only"


def run_command(env, ln, cmd, other):
    for rx, handler in NOT_RUN:
        m = rx.match(cmd)
        if m:
            why = handler(env, m)
            print(f"  README.md:{ln}: {why}: {cmd}")
            other.append(f"{cmd}: {why.split(';')[0]}")
            return 0
    try:
        tokens = shlex.split(cmd)
    except ValueError as e:
        fail(f"cannot parse `{cmd}`: {e}")
    stdin = None
    if "|" in tokens:  # a pipeline: only `echo TEXT | command` is known
        i = tokens.index("|")
        if tokens[0] != "echo" or "|" in tokens[i + 1:]:
            fail(f"don't know how to run the pipeline `{cmd}`")
        stdin, tokens = " ".join(tokens[1:i]) + "\n", tokens[i + 1:]
    if not tokens or tokens[0] not in ("oomb", "oombd"):
        fail(f"don't know how to check `{cmd}` (add it to test_readme.py's NOT_RUN or CHECKS)")
    program, args = tokens[0], tokens[1:]
    binary = env.oomb if program == "oomb" else env.oombd
    n = 0
    if args and "|" in args[0]:  # alternatives: `cancel|pause|resume|delete JOB`
        verbs = args[0].split("|")
        if program == "oomb" and set(verbs) <= set(VERB_ORDER):
            run_verbs(env, ln, verbs, args[1:])
            return len(verbs)
        expanded = [[v] + args[1:] for v in verbs]
    else:
        expanded = [args]
    for a in expanded:
        for var in variants(a):
            c = Cmd(program, var, stdin)
            check = CHECKS.get((program, c.sub()))
            if check is None:
                fail(f"no output check for `{program} {c.sub()}` (add one to test_readme.py's CHECKS)")
            c.args = substitute(env, program, var, env.trained_job)
            c.unshrunk = substitute(env, program, var, env.trained_job, shrink=False)
            p = env.run([binary] + c.args, stdin=stdin)
            if not p.stdout.strip():
                fail(f"`{c.text()}` printed nothing on stdout")
            try:
                detail = check(env, c, p)
            except CheckError as e:
                fail(f"`{c.text()}`: {e}")
            shown = shlex.join([program] + var)
            if c.args != c.unshrunk:  # what ran, CI's sizes and placeholders shown
                short = [a.replace(env.files + "/", "").replace(SMOL, "$MODEL") for a in c.args]
                shown += f" [as run: {shlex.join([program] + short)}]"
            print(f"  README.md:{ln}: ran ({p.seconds:.1f} s): {'echo ... | ' if stdin else ''}{shown}: {detail}")
            n += 1
    return n


# --- python blocks -------------------------------------------------------------------------------

def check_python(env, line, body):
    code = "\n".join(body) + "\n"
    table = {"CHECKPOINT_DIR": env.checkpoint_dir, "BASE_MODEL_DIR": lambda: SMOL}
    for name in set(re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b", code)) - set(table):
        fail(f"placeholder {name} is not in test_readme.py's table ({', '.join(table)})")
    for name, value in table.items():
        if re.search(rf"\b{name}\b", code):
            code = re.sub(rf"\b{name}\b", lambda m, value=value: repr(value()), code)
    code += ('\nfor _name in ("model", "tokenizer"):\n'
             '    if _name in globals():\n'
             '        print("readme-python:", _name, type(globals()[_name]).__name__)\n')
    f = env.path(f"readme-{line}.py")
    with open(f, "w") as out:
        out.write(code)
    p = env.run([sys.executable, f], timeout=300)
    got = re.findall(r"^readme-python: (\w+) (\w+)$", p.stdout, re.M)
    if "model" in code and not any(n == "model" for n, _ in got):
        fail(f"the code made no model:\n{tail(p.stdout)}")
    types = ", ".join(f"{n} {t}" for n, t in got)
    if "PeftModel.from_pretrained" in code and "Peft" not in types:
        fail(f"the model is not a PEFT model: {types}")
    return f"ran ({p.seconds:.1f} s): {types}"


CHECKERS = {"yaml": check_yaml, "yml": check_yaml, "bash": check_bash, "sh": check_bash, "python": check_python,
            "py": check_python}


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    oombd, oomb, readme = (os.path.abspath(a) for a in sys.argv[1:])
    for f in (os.path.join(SMOL, "config.json"), os.path.join(SMOL, "model.safetensors")) + tuple(
            os.path.join(AUSTEN, n + ".txt") for n in ("emma", "persuasion", "prideprejudice", "northangerabbey",
                                                       "mansfieldpark", "sensesensibility")):
        if not os.path.isfile(f):
            print(f"readme: skipped: {f} is absent (scripts/fetch_test_data.sh)")
            return 77
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    t0 = time.time()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # ctest's timeout: stop the daemon first
    tmp = tempfile.mkdtemp(prefix="oomb-readme-test.", dir="/tmp")
    env = Env(oombd, oomb, tmp)
    failures = []
    try:
        blocks = fenced_blocks(text)
        # job.yaml of the bash blocks: the README's first complete job spec, its paths mapped.
        for _line, lang, body, _ in blocks:
            if lang in ("yaml", "yml"):
                doc = yaml.safe_load("\n".join(body))
                if isinstance(doc, dict) and "model" in doc and "method" in doc:
                    env.job_yaml_text = env.map_paths("\n".join(body) + "\n", doc)
                    break
        env.start_daemon()
        print(f"readme: {len(blocks)} blocks in {readme}; oombd serving on {env.endpoint}; files in {env.files}")
        for line, lang, body, _ in blocks:
            checker = CHECKERS.get(lang)
            t = time.time()
            try:
                if checker is None:
                    fail(f"a ```{lang or ' (unlabelled)'} block that test_readme.py cannot check: label it bash, yaml "
                         f"or python, or teach tests/python/test_readme.py how to check it")
                result = checker(env, line, body)
                print(f"README.md:{line}: ok ({result}) [{time.time() - t:.1f} s]", flush=True)
            except CheckError as e:
                msg = str(e) if str(e).startswith("README.md:") else f"README.md:{line}: {e}"
                failures.append(msg)
                print(f"README.md:{line}: FAILED ({lang or 'unlabelled'} block): {msg}", flush=True)
        if env.daemon.poll() is not None:  # first: it explains the failures that follow from it
            failures.insert(0, f"oombd serve exited {env.daemon.returncode} during the test:\n{env.daemon_log()}")
    except CheckError as e:
        failures.append(str(e))
    finally:
        env.stop_daemon()
        if failures and env.daemon is not None:
            print(f"readme: the daemon's log ({tmp}/oombd.log), last lines:\n{env.daemon_log()}", file=sys.stderr)
    elapsed = time.time() - t0
    if failures:
        print(f"readme: FAILED: {len(failures)} problem(s) in {elapsed:.0f} s (files kept in {tmp}):")
        for f in failures:
            print(f"  {f}")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"readme: {len(blocks)} blocks checked in {elapsed:.0f} s")
    print("readme: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
