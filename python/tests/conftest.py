import os
import sys

import pytest

SOURCE_DIR = os.environ.get("LOCKSTEP_SOURCE_DIR",
                            os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


@pytest.fixture(autouse=True)
def _quiet_state():
    import lockstep
    lockstep.wait()
    yield
    lockstep.debug.stop_expecting_steady()
    lockstep.wait()


def run_python(args, **kw):
    """Runs a fresh interpreter (Debian's, as the tests) with the build tree's package."""
    import subprocess
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    return subprocess.run([sys.executable] + args, capture_output=True, text=True, env=env,
                          timeout=600, **kw)


def step_site(path, marker):
    """The per-site statistics (lockstep.debug.sites()) of the step entered on the line of `path`
    that ends with `# marker`."""
    import lockstep
    line = [i for i, s in enumerate(open(path), 1) if s.rstrip().endswith("# " + marker)][0]
    name = "step at %s:%d" % (path, line)
    sites = [s for s in lockstep.debug.sites() if s["site"] == name]
    assert len(sites) == 1, (name, [s["site"] for s in lockstep.debug.sites()])
    return sites[0]

