# SPDX-License-Identifier: MIT
"""The package as users install it. CMake's install into a prefix, imported
from there with nothing set: it loads the library it was installed with,
and its C data path. A wheel built from the source tree with the system's
setuptools against that prefix's header and library (pkg-config), installed
into a fresh venv: a worker runs in it against the build's library
(STASH_LIBRARY), and against the prefix's found by the system's loader. A
wheel built where no libstash is installed leaves its C data path out and
works through ctypes alone.

Run by ctest with STASH_BUILD_DIR and STASH_SOURCE_DIR; without
python3-venv, python3-pip, python3-setuptools or python3-wheel it says
which is missing and exits 77, which ctest counts as skipped."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

BUILD = os.environ.get("STASH_BUILD_DIR", "")
SOURCE = os.environ.get("STASH_SOURCE_DIR", "")
PYTHON = "/usr/bin/python3"

# A small worker: two of four key groups' keys written and read back, a
# second worker at its index refused; prints what it ran with, as JSON.
WORKER = r"""
import importlib.metadata, json, os, sys
import stash
name = sys.argv[1]
arena = stash.Arena.create(name, size=8 << 20, max_parallelism=8, replace=True)
try:
    with stash.Worker(name, index=0, parallelism=2) as w:
        count = w.state("count")
        keys = [k for k in range(200) if stash.key_group(k, 8) in range(*w.info()["range"])]
        count.write_many(keys, [k * 2 for k in keys])
        assert [stash.as_int(v) for v in count.read_many(keys)] == [k * 2 for k in keys]
        try:
            stash.Worker(name, index=0, parallelism=2)
            busy = None
        except stash.Busy as e:
            busy = e.code.name
finally:
    arena.close()
    stash.Arena.destroy(name)
try:
    dist = importlib.metadata.version("stash")
except importlib.metadata.PackageNotFoundError:
    dist = None
with open("/proc/self/maps") as f:
    loaded = sorted({os.path.realpath(line.split()[-1]) for line in f if "libstash.so" in line})
print(json.dumps({"module": stash.__file__, "version": stash.__version__,
                  "library": stash.version(), "dist": dist, "loaded": loaded,
                  "fast": stash._fast.__file__ if stash._fast else None, "busy": busy,
                  "keys": len(keys)}))
"""


def header_version():
    with open(os.path.join(SOURCE, "include", "stash.h")) as f:
        text = f.read()
    return ".".join(re.search(rf"^#define STASH_VERSION_{p} ([0-9]+)$", text, re.M).group(1)
                    for p in ("MAJOR", "MINOR", "PATCH"))


def clean_env(**more):
    """The environment without what would lead Python or the loader to
    another stash than the one under test."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "STASH_LIBRARY", "LD_LIBRARY_PATH", "PKG_CONFIG_PATH",
                        "STASH_INCLUDE_DIR", "STASH_LIBRARY_DIR", "STASH_EXTENSION")}
    env.update(more)
    return env


def run(cmd, env, cwd, check=True):
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}\n"
                             f"{p.stderr[-3000:]}")
    return p


class Package(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.top = tempfile.mkdtemp(prefix="stash-py-package-")
        cls.prefix = os.path.join(cls.top, "prefix")
        run(["cmake", "--install", BUILD, "--prefix", cls.prefix], clean_env(), cls.top)
        # lib, or lib/x86_64-linux-gnu where the build's prefix is /usr.
        found = glob.glob(os.path.join(cls.prefix, "lib*", "**", "libstash.so.0"), recursive=True)
        assert len(found) == 1, found
        cls.libdir = os.path.dirname(found[0])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.top, ignore_errors=True)

    def worker(self, python, env):
        """What WORKER printed, run by python in a directory of its own."""
        name = f"t-py-pkg-{os.getpid()}-{self.id().rsplit('.', 1)[-1][:20]}"
        p = run([python, "-c", WORKER, name], env, self.top)
        got = json.loads(p.stdout)
        self.assertEqual(got["busy"], "EBUSY")
        self.assertGreater(got["keys"], 0)
        self.assertEqual(got["version"], header_version())
        return got

    def source(self):
        """A copy of the source tree's parts a wheel is built from: pip
        builds in the directory it is given, and setuptools reuses what an
        earlier build left there."""
        src = tempfile.mkdtemp(prefix="src-", dir=self.top)
        shutil.copytree(os.path.join(SOURCE, "python"), os.path.join(src, "python"),
                        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info",
                                                      "__pycache__"))
        os.makedirs(os.path.join(src, "include"))
        shutil.copy(os.path.join(SOURCE, "include", "stash.h"), os.path.join(src, "include"))
        return os.path.join(src, "python")

    def pip_wheel(self, out, env):
        return run([PYTHON, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                    "--no-index", "-w", out, self.source()], clean_env(**env), self.top,
                   check=False)

    def wheel(self, out, **env):
        """Builds a wheel of the source tree into out: its path."""
        p = self.pip_wheel(out, env)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        wheels = glob.glob(os.path.join(out, "stash-*.whl"))
        self.assertEqual(len(wheels), 1, wheels)
        return wheels[0]

    def venv(self, wheel):
        """A fresh venv with wheel installed: its python."""
        where = tempfile.mkdtemp(prefix="venv-", dir=self.top)
        run([PYTHON, "-m", "venv", where], clean_env(), self.top)
        python = os.path.join(where, "bin", "python")
        run([python, "-m", "pip", "install", "--no-index", "--no-deps", wheel], clean_env(),
            self.top)
        return where, python

    def test_the_installed_module_loads_the_library_it_came_with(self):
        pydir = glob.glob(os.path.join(self.prefix, "lib", "python3*", "dist-packages"))
        self.assertEqual(len(pydir), 1, pydir)
        got = self.worker(PYTHON, clean_env(PYTHONPATH=pydir[0]))
        self.assertTrue(got["module"].startswith(pydir[0]), got)
        self.assertEqual(got["loaded"], [os.path.realpath(os.path.join(self.libdir,
                                                                       "libstash.so.0"))])
        self.assertTrue(got["fast"] and got["fast"].startswith(pydir[0]), got)
        self.assertEqual(got["library"], header_version())

    def test_a_wheel_built_against_the_installed_libstash_runs_in_a_fresh_venv(self):
        wheel = self.wheel(os.path.join(self.top, "dist"),
                           PKG_CONFIG_PATH=os.path.join(self.libdir, "pkgconfig"))
        self.assertRegex(os.path.basename(wheel),
                         rf"^stash-{re.escape(header_version())}-cp3\d+-cp3\d+-linux_\w+\.whl$")
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            installed = z.read("stash/_installed.py").decode()
        self.assertTrue(any(re.match(r"stash/_stash\..*\.so$", n) for n in names), names)
        self.assertFalse([n for n in names if n.endswith((".c", ".in"))], names)
        self.assertIn(f'VERSION = "{header_version()}"', installed)
        self.assertIn("LIBRARY = None", installed)
        venv, python = self.venv(wheel)
        build_lib = os.path.realpath(os.path.join(BUILD, "libstash.so.0"))
        got = self.worker(python, clean_env(STASH_LIBRARY=build_lib))
        self.assertTrue(got["module"].startswith(venv), got)
        self.assertEqual(got["dist"], header_version())
        self.assertEqual(got["loaded"], [build_lib])
        self.assertTrue(got["fast"] and got["fast"].startswith(venv), got)
        # Without STASH_LIBRARY: the library the system's loader finds.
        got = self.worker(python, clean_env(LD_LIBRARY_PATH=self.libdir))
        self.assertEqual(got["loaded"], [os.path.realpath(os.path.join(self.libdir,
                                                                       "libstash.so.0"))])
        p = run([python, "-c", "import stash"], clean_env(), self.top, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("cannot load libstash.so.0 (install it, or set STASH_LIBRARY", p.stderr)

    def test_a_wheel_built_without_an_installed_libstash_goes_through_ctypes(self):
        nowhere = os.path.join(self.top, "no-stash")
        os.makedirs(nowhere, exist_ok=True)
        env = {"STASH_INCLUDE_DIR": nowhere, "STASH_LIBRARY_DIR": nowhere}
        p = self.pip_wheel(os.path.join(self.top, "none"), dict(env, STASH_EXTENSION="required"))
        self.assertNotEqual(p.returncode, 0, "STASH_EXTENSION=required fails without it")
        self.assertIn("stash.h", p.stdout + p.stderr)
        wheel = self.wheel(os.path.join(self.top, "ctypes"), **env)
        with zipfile.ZipFile(wheel) as z:
            self.assertFalse([n for n in z.namelist() if n.endswith(".so")])
        venv, python = self.venv(wheel)
        got = self.worker(python, clean_env(STASH_LIBRARY=os.path.join(BUILD, "libstash.so.0")))
        self.assertIsNone(got["fast"])
        self.assertEqual(got["dist"], header_version())


def missing():
    """What the tests need and the machine lacks, or None."""
    if not (BUILD and SOURCE):
        return "STASH_BUILD_DIR and STASH_SOURCE_DIR (ctest sets them)"
    lacking = subprocess.run(
        [PYTHON, "-c", "import importlib.util as u; print(*(m for m in ('venv', 'ensurepip', "
         "'pip', 'setuptools', 'wheel') if u.find_spec(m) is None))"],
        capture_output=True, text=True).stdout.split()
    if lacking:
        return (f"{PYTHON}'s modules {', '.join(lacking)} (python3-venv, python3-pip, "
                "python3-setuptools, python3-wheel)")
    if not shutil.which("cmake"):
        return "cmake"
    return None


if __name__ == "__main__":
    lacking = missing()
    if lacking:
        print(f"test_package: skipped: no {lacking}")
        sys.exit(77)
    unittest.main()
