"""The seed's loop as a Python program, alone and under mpirun; the installed package."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import SOURCE_DIR, run_python

LINE = re.compile(r"^epoch: 1, step: (\d+), loss: ([0-9.]+), rate: ([0-9.e+]+)$")
RECORD = re.compile(r"epoch: 1, step: (\d+), loss: [0-9.]+, rate: [0-9]+\.[0-9]+(?:e[+-]?[0-9]+)?")


def test_train_resnet_fake_prints_the_seeds_lines():
    r = run_python([os.path.join(SOURCE_DIR, "examples", "train_resnet_fake.py"), "--steps", "11",
                    "--batch", "4", "--image-size", "16"])
    assert r.returncode == 0, r.stderr
    steps = [int(LINE.match(l).group(1)) for l in r.stdout.splitlines() if LINE.match(l)]
    assert steps == [0, 10], r.stdout
    assert "implicit syncs: 0" in r.stdout


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")
def test_train_resnet_fake_under_mpirun_prints_a_line_per_replica():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = ["mpirun", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
           sys.executable, os.path.join(SOURCE_DIR, "examples", "train_resnet_fake.py"),
           "--steps", "11", "--batch", "4", "--image-size", "16"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    # mpirun forwards each rank's output in the chunks it reads, so two ranks' lines can land
    # on one line of the merged stream: find the records anywhere rather than line by line.
    steps = sorted(int(m.group(1)) for m in RECORD.finditer(r.stdout))
    assert steps == [0, 0, 10, 10], r.stdout


def test_the_installed_package_imports_in_a_fresh_interpreter():
    build = os.path.dirname(os.path.dirname(os.path.abspath(
        __import__("lockstep").__file__)))  # <build>/python
    with tempfile.TemporaryDirectory() as prefix:
        r = subprocess.run(["cmake", "--install", os.path.dirname(build), "--prefix", prefix,
                            "--component", "Unspecified"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        found = [root for root, dirs, files in os.walk(prefix) if "__init__.py" in files
                 and os.path.basename(root) == "lockstep"]
        assert len(found) == 1, found
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = os.path.dirname(found[0])
        r = subprocess.run([sys.executable, "-c",
                            "import lockstep; print(lockstep.__file__); "
                            "print((lockstep.ones(2) * 3).sum().item())"],
                           capture_output=True, text=True, env=env, cwd=prefix)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [os.path.join(found[0], "__init__.py"), "6.0"]
