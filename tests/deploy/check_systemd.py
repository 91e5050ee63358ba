#!/usr/bin/env python3
"""Checks of deploy/systemd (ctest: deploy_systemd_unit).

  check_systemd.py OOMBD REPO_ROOT

- `systemd-analyze verify` on oombd.service (ExecStart pointed at the built oombd, since verify
  requires the binary to exist) prints nothing: no unknown key, no bad value;
- `systemd-sysusers --dry-run` accepts oomb.sysusers.conf and creates the unit's User=;
- the unit is Type=notify, Restart=on-failure, with StateDirectory= holding the data dir and
  RuntimeDirectory= holding the Unix socket, and none of the options that break CUDA;
- config.yaml with the unit's Environment= applied goes through the real `oombd config print`
  (so every OOMB_SECTION__KEY in the unit is a real key), and TimeoutStopSec= exceeds its
  shutdown_grace_seconds plus the 5 s oombd gives open RPCs.
First the checker is shown to catch a broken unit. Prints "check_systemd: ok" and exits 0, or
lists every problem and exits 1; exits 77 (skip) without systemd-analyze.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oombd_config import ConfigError, effective_config  # noqa: E402

problems = []


def check(cond, message):
    if not cond:
        problems.append(message)
    return cond


def parse_unit(text):
    """{(section, key): [values]} of a unit file (continuation lines are not used here)."""
    entries, section = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.setdefault((section, key.strip()), []).append(value.strip())
    return entries


def seconds(value):
    """A systemd time span ("90s", "2min", "1min 30s", "90") in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "ms": 0.001}
    total = 0.0
    for n, unit in re.findall(r"(\d+)\s*([a-z]*)", value):
        total += int(n) * units[unit]
    return total


def verify(unit_text, oombd, tmp, name="oombd.service"):
    """Output of systemd-analyze verify on `unit_text` with ExecStart= on the built oombd: the
    lines about this unit (other units of the host may have warnings of their own)."""
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(re.sub(r"^ExecStart=/opt/oomb/bin/oombd", "ExecStart=" + oombd, unit_text, flags=re.M))
    r = subprocess.run(["systemd-analyze", "verify", path], capture_output=True, text=True)
    out = [l for l in (r.stdout + r.stderr).splitlines() if name in l or "oombd" in l]
    if r.returncode != 0 and not out:
        out = [f"systemd-analyze verify exited {r.returncode}: {r.stderr.strip()}"]
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    oombd, repo = os.path.abspath(sys.argv[1]), sys.argv[2]
    if shutil.which("systemd-analyze") is None:
        print("check_systemd: skipped: no systemd-analyze (Debian package systemd)")
        sys.exit(77)
    d = os.path.join(repo, "deploy/systemd")
    with open(os.path.join(d, "oombd.service")) as f:
        unit_text = f.read()
    unit = parse_unit(unit_text)

    def get(key, section="Service"):
        return unit.get((section, key), [None])[-1]

    with tempfile.TemporaryDirectory() as tmp:
        # The checker sees a broken unit.
        broken = unit_text.replace("Type=notify", "Type=notifyy").replace("Restart=on-failure", "Restart=sometimes")
        caught = verify(broken, oombd, tmp, "broken-oombd.service")
        check(len(caught) >= 2, f"self-test: systemd-analyze verify missed a bad Type= and Restart=: {caught}")
        for line in verify(unit_text, oombd, tmp):
            problems.append("systemd-analyze verify: " + line)

        root = os.path.join(tmp, "root")
        os.makedirs(root)
        r = subprocess.run(["systemd-sysusers", "--dry-run", "--root=" + root, os.path.join(os.path.abspath(d), "oomb.sysusers.conf")],
                           capture_output=True, text=True)
        if shutil.which("systemd-sysusers"):
            check(r.returncode == 0 and f"Creating user '{get('User')}'" in r.stdout + r.stderr,
                  f"oomb.sysusers.conf does not create User={get('User')}: {r.stdout}{r.stderr}")

    check(get("Type") == "notify", f"Type={get('Type')}, want notify")
    check(get("NotifyAccess") in (None, "main"), "NotifyAccess= must stay main (oombd notifies itself)")
    check(get("Restart") == "on-failure", f"Restart={get('Restart')}, want on-failure")
    check(get("User") not in (None, "root"), "a dedicated User= is needed")
    for key in ("PrivateDevices", "MemoryDenyWriteExecute", "PrivateUsers"):
        check(get(key) in (None, "false", "no"), f"{key}= breaks CUDA (docs/DEPLOY.md)")
    check(get("ProcSubset") in (None, "all"), "ProcSubset=pid hides /proc/driver/nvidia")

    env = {}
    for value in unit.get(("Service", "Environment"), []):
        k, _, v = value.partition("=")
        env[k] = v
    oomb_env = {k: v for k, v in env.items() if k.startswith("OOMB_")}
    args = get("ExecStart").split()
    config_file = args[args.index("--config") + 1] if "--config" in args else None
    check(config_file == "/etc/oomb/config.yaml", f"ExecStart= reads {config_file}; the install steps put /etc/oomb/config.yaml")
    try:
        config = effective_config(oombd, os.path.join(d, "config.yaml"), oomb_env)
    except ConfigError as e:
        problems.append(f"config.yaml with the unit's environment refused by oombd: {e}")
        config = None
    if config is not None:
        server = config["server"]
        check(server["data_dir"] == "/var/lib/" + (get("StateDirectory") or "?"),
              f"server.data_dir {server['data_dir']} is not StateDirectory= (/var/lib/{get('StateDirectory')})")
        check(server["unix_socket"] is True and os.path.dirname(server["unix_socket_path"]) == "/run/" + (get("RuntimeDirectory") or "?"),
              f"the Unix socket {server['unix_socket_path']} is not in RuntimeDirectory= (/run/{get('RuntimeDirectory')})")
        stop = seconds(get("TimeoutStopSec") or "90s")
        need = int(server["shutdown_grace_seconds"]) + 5
        check(stop > need, f"TimeoutStopSec={get('TimeoutStopSec')} must exceed shutdown_grace_seconds + 5 = {need} s")
        for root in (config["paths"]["allowed_roots"] or "").split(","):
            if root and get("ProtectSystem") == "strict":
                check(any(root == p.lstrip("-") for p in " ".join(unit.get(("Service", "ReadWritePaths"), [])).split()),
                      f"paths.allowed_roots {root} is read-only under ProtectSystem=strict: add it to ReadWritePaths=")
    watchdog = get("WatchdogSec")
    if watchdog:
        check(seconds(watchdog) >= 20, f"WatchdogSec={watchdog}: oombd pings every 5 s at most; leave room")

    if problems:
        for p in problems:
            print("check_systemd: " + p)
        print(f"check_systemd: {len(problems)} problem(s)")
        sys.exit(1)
    print("check_systemd: ok")


if __name__ == "__main__":
    main()
