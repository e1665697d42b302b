"""Debian tools some tests drive (chromium, promtool). `make test` installs them when it runs as
root (Makefile, target `tools`); elsewhere a test that needs one skips and says exactly why."""

from __future__ import annotations

import shutil

import pytest

# command -> the Debian package that provides it
PACKAGES = {"chromium": "chromium", "promtool": "prometheus"}


def require_tool(command: str) -> str:
    """The command's path, or skip the test naming the missing package and how to get it."""
    path = shutil.which(command)
    if path is None:
        package = PACKAGES.get(command, command)
        pytest.skip(
            f"{command} is not installed: `make test` installs Debian's {package} package when "
            f"run as root; otherwise run `apt-get install {package}` as root"
        )
    return path
