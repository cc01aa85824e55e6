"""lockstep.dist.ZeroRedundancyOptimizer (ZeRO stage 1) from Python, with PyTorch's signature:
alone it updates as the optimizer it wraps; under mpirun its two ranks train bit for bit as
DataParallel with the whole optimizer, each keeping part of the state."""
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lockstep

SCRIPT = textwrap.dedent("""
    import sys
    import lockstep
    import lockstep.nn.functional as F
    lockstep.dist.init()
    rank, world = lockstep.dist.rank(), lockstep.dist.world_size()
    lockstep.manual_seed(5 + rank)  # DataParallel gives every rank rank 0's weights
    model = lockstep.nn.Sequential(lockstep.nn.Linear(8, 16), lockstep.nn.ReLU(),
                                   lockstep.nn.Linear(16, 3))
    dp = lockstep.dist.DataParallel(model)
    if sys.argv[1] == "zero":
        opt = lockstep.dist.ZeroRedundancyOptimizer(model.parameters(), lockstep.optim.AdamW,
                                                     lr=0.01, weight_decay=0.1)
    else:
        opt = lockstep.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    for s in range(4):
        lockstep.manual_seed(100 * s + rank)
        x, y = lockstep.randn(4, 8), lockstep.randint(0, 3, (4,))
        with lockstep.step():
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            dp.average_gradients()
            opt.step()
            loss = lockstep.dist.all_reduce(loss, 1.0 / world)
        print("rank %d step %d loss %.9g" % (rank, s, loss.item()), flush=True)
    if sys.argv[1] == "zero":
        print("rank %d state %d" % (rank, opt.local_state_numel()), flush=True)
    print("rank %d hash %016x" % (rank, dp.state_hash()), flush=True)
""")


def test_alone_it_updates_as_the_optimizer_it_wraps():
    def train(make):
        lockstep.manual_seed(2)
        model = lockstep.nn.Linear(5, 4)
        opt = make(model.parameters())
        for s in range(3):
            with lockstep.step():
                opt.zero_grad()
                (model(lockstep.ones(2, 5) * (s + 1)) ** 2).sum().backward()
                opt.step()
        return [p.numpy() for p in model.parameters()], opt

    want, _ = train(lambda ps: lockstep.optim.SGD(ps, lr=0.05, momentum=0.9))
    got, zero = train(lambda ps: lockstep.dist.ZeroRedundancyOptimizer(
        ps, lockstep.optim.SGD, lr=0.05, momentum=0.9))
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    assert zero.owner(0) == 0 and zero.owner(1) == 0
    assert isinstance(zero.local_optimizer, lockstep.optim.SGD)
    assert zero.local_state_numel() == 5 * 4 + 4
    assert "0.momentum_buffer" in dict(zero.state_dict())
    with pytest.raises(TypeError):
        lockstep.dist.ZeroRedundancyOptimizer([lockstep.zeros(2)], int)


def test_a_sharded_checkpoint_resumes_the_same_training(tmp_path):
    def run(steps, load=None, save_at=None):
        lockstep.manual_seed(1)
        model = lockstep.nn.Linear(4, 3)
        opt = lockstep.dist.ZeroRedundancyOptimizer(model.parameters(), lockstep.optim.Adam,
                                                    lr=0.1)
        first = 0
        if load:
            first = int(lockstep.dist.load_sharded(str(load), model, opt)["step"]) + 1
        losses = []
        for s in range(first, steps):
            with lockstep.step():
                opt.zero_grad()
                loss = (model(lockstep.ones(2, 4) * (s + 1)) ** 2).mean()
                loss.backward()
                opt.step()
            losses.append(loss.item())
            if s == save_at:
                lockstep.dist.save_sharded(str(tmp_path / "ck"), model, opt,
                                           metadata={"step": str(s)})
        return losses

    whole = run(5)
    run(5, save_at=2)
    assert sorted(os.listdir(tmp_path / "ck")) == ["index.safetensors",
                                                   "shard-0-of-1-g1.safetensors"]
    assert run(5, load=tmp_path / "ck") == whole[3:]
    with pytest.raises(lockstep.Error, match="holds no index"):
        lockstep.dist.load_sharded(str(tmp_path), lockstep.nn.Linear(4, 3))


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")
def test_two_ranks_train_as_data_parallel_and_split_the_state(tmp_path):
    script = tmp_path / "zero.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    outs = {}
    for mode in ("plain", "zero"):
        cmd = ["mpirun", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH", "-x",
               "OMP_NUM_THREADS", sys.executable, str(script), mode]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        outs[mode] = r.stdout
    # mpirun forwards each rank's output in the chunks it reads: two ranks' lines can land on one
    # line of the merged stream, so records are found anywhere.
    losses = {m: sorted(re.findall(r"rank \d step \d loss [0-9.e+-]+", o)) for m, o in outs.items()}
    assert len(losses["zero"]) == 8 and losses["zero"] == losses["plain"], outs
    hashes = {m: set(re.findall(r"hash ([0-9a-f]{16})", o)) for m, o in outs.items()}
    assert len(hashes["zero"]) == 1 and hashes["zero"] == hashes["plain"], outs
    state = [int(n) for n in re.findall(r"rank \d state (\d+)", outs["zero"])]
    whole = 2 * (8 * 16 + 16 + 16 * 3 + 3)  # AdamW: two moments per element
    assert len(state) == 2 and min(state) > 0 and sum(state) == whole, outs["zero"]
