"""A daemon thread inside a blocking lockstep call when the interpreter exits: the call returns
during finalization and the thread stays parked instead of aborting the process (NoGil in
python/src/common.h)."""
import subprocess
import sys

PROGRAM = """
import sys, threading, lockstep
started = threading.Event()
def blocked_in_wait():
    x = lockstep.randn([512, 512])
    while True:
        y = x @ x @ x @ x
        lockstep.sync()
        started.set()
        lockstep.wait()
def blocked_in_next():
    data = lockstep.data.dataset("fake", shape=[3, 64, 64], size=1 << 20)
    for _ in lockstep.data.DataLoader(data, batch_size=256):
        started.set()
target = blocked_in_wait if sys.argv[1] == "wait" else blocked_in_next
threading.Thread(target=target, daemon=True).start()
started.wait()
"""


def test_a_daemon_thread_blocked_in_lockstep_at_exit_exits_cleanly():
    for i in range(10):
        for call in ("wait", "next"):
            out = subprocess.run([sys.executable, "-c", PROGRAM, call], capture_output=True,
                                 text=True, timeout=120)
            assert "terminate called" not in out.stderr, (i, call, out.stderr)
            assert out.returncode == 0, (i, call, out.returncode, out.stderr)
