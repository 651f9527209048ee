"""System programs some tests drive (a real Prometheus, tmux): found on PATH, else installed with
apt-get when we are root (as `.ci/run` does), else the test is skipped naming what is missing."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def require_program(program: str, package: str) -> str:
    """The path of `program`; installs Debian `package` when missing and possible, else skips."""
    path = shutil.which(program)
    if path is not None:
        return path
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"{program} is not installed and the Debian package {package!r} cannot be installed "
                    f"here (not root or no apt-get); run `apt-get install {package}` or .ci/run")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300, check=False)
        done = subprocess.run(["apt-get", "install", "-y", "-qq", package], env=env, capture_output=True,
                              text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"{program} is not installed and `apt-get install {package}` failed: {exc}")
    path = shutil.which(program)
    if path is None:
        pytest.skip(f"{program} is not installed and `apt-get install {package}` failed: "
                    f"{done.stderr.strip()[-300:]}")
    return path
