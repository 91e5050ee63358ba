"""oombd's effective configuration as the real binary computes it (`oombd config print`).

Shared by check_k8s.py and check_systemd.py: a configuration file shipped in deploy/ is only
right if the daemon that will read it accepts every key and value in it.
"""
import os
import subprocess

import yaml


class ConfigError(Exception):
    """oombd refused the configuration; the message is its own (file:line: key: why)."""


def effective_config(oombd, path, env=None):
    """The effective configuration (dict of sections) of `oombd config print --config path`,
    with `env` (OOMB_SECTION__KEY variables) applied on top and no OOMB_* variable of this
    process leaking in."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OOMB_")}
    clean.update(env or {})
    r = subprocess.run([oombd, "config", "print", "--config", path], env=clean, capture_output=True, text=True)
    if r.returncode != 0:
        raise ConfigError(r.stderr.strip() or f"oombd config print exited {r.returncode}")
    return yaml.safe_load(r.stdout)


def port_of(listen):
    """The port of a host:port listen address."""
    return int(listen.rsplit(":", 1)[1])
