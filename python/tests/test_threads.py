"""How lockstep's OpenMP threads wait: the package sets GOMP_SPINCOUNT=10000 before its extension
loads libgomp, unless the environment chooses (lockstep/runtime.h, apply_thread_wait_default)."""
import os
import subprocess
import sys

PROGRAM = "import lockstep, os; print(lockstep.thread_wait_setting()); " \
          "print(os.environ.get('GOMP_SPINCOUNT'))"


def run_with(**overrides):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(overrides)
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")[:2]


def test_the_default_is_a_short_spin():
    assert run_with() == ["GOMP_SPINCOUNT=10000", "10000"]


def test_a_setting_of_the_users_stands():
    assert run_with(OMP_WAIT_POLICY="passive") == ["OMP_WAIT_POLICY=passive", "None"]
    assert run_with(GOMP_SPINCOUNT="5") == ["GOMP_SPINCOUNT=5", "5"]
