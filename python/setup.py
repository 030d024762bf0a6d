# SPDX-License-Identifier: MIT
"""What pyproject.toml cannot say: the package's version, read from
include/stash.h's STASH_VERSION_* as CMake reads it, and the C data path
(stash._stash), built against the installed libstash's header and library
where they are and left out where it does not build: the package then
goes through ctypes alone.

The installed libstash is found through $STASH_INCLUDE_DIR and
$STASH_LIBRARY_DIR, else pkg-config's stash.pc, else the compiler's own
search; STASH_EXTENSION=required makes a failed build of the extension
fail the wheel."""

import os
import re
import shlex
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def pkg_config(option):
    """pkg-config's answer to OPTION for stash, as a list; [] without
    pkg-config or without stash.pc on its path."""
    try:
        out = subprocess.run(["pkg-config", option, "stash"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return shlex.split(out)


def dirs(variable, option):
    """The directories $VARIABLE lists, else those pkg-config gives."""
    given = [d for d in os.environ.get(variable, "").split(os.pathsep) if d]
    return given or [f[2:] for f in pkg_config(option) if f[:2] in ("-I", "-L")]


INCLUDE_DIRS = dirs("STASH_INCLUDE_DIR", "--cflags-only-I")
LIBRARY_DIRS = dirs("STASH_LIBRARY_DIR", "--libs-only-L")


def header_version():
    """STASH_VERSION_MAJOR.MINOR.PATCH of the source tree's header, else of
    the installed one."""
    tree = os.path.join(HERE, os.pardir, "include")
    for d in [tree] + INCLUDE_DIRS + ["/usr/local/include", "/usr/include"]:
        path = os.path.join(d, "stash.h")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            text = f.read()
        parts = [re.search(rf"^#define STASH_VERSION_{p} ([0-9]+)$", text, re.M)
                 for p in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            return ".".join(m.group(1) for m in parts)
    raise SystemExit("setup.py: no stash.h to read the version from: build from the source "
                     "tree, or install libstash's header (STASH_INCLUDE_DIR names its directory)")


VERSION = header_version()


class BuildPy(build_py):
    """Writes stash/_installed.py into the wheel, as CMake writes it into
    its install: the version, and no library path (the system's loader
    finds libstash.so.0, or STASH_LIBRARY names it)."""

    def run(self):
        super().run()
        with open(os.path.join(HERE, "stash", "_installed.py.in")) as f:
            text = f.read()
        text = text.replace("@PROJECT_VERSION@", VERSION).replace("@STASH_PY_LIBRARY@", "None")
        with open(os.path.join(self.build_lib, "stash", "_installed.py"), "w") as f:
            f.write(text)


setup(
    version=VERSION,
    packages=["stash"],
    # The wheel holds the modules alone: not _stash.c, nor the template of
    # _installed.py (an sdist has them: MANIFEST.in).
    include_package_data=False,
    cmdclass={"build_py": BuildPy},
    ext_modules=[Extension("stash._stash", ["stash/_stash.c"], include_dirs=INCLUDE_DIRS,
                           library_dirs=LIBRARY_DIRS, libraries=["stash"],
                           optional=os.environ.get("STASH_EXTENSION") != "required")],
)
