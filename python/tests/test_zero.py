"""lockstep.dist.ZeroRedundancyOptimizer (ZeRO stages 1 and 2) and fully_shard (stage 3) from
Python, with PyTorch's signature: alone it updates as the optimizer it wraps; under mpirun its two
ranks train bit for bit as DataParallel with the whole optimizer, each keeping part of the state
(and under stages 2 and 3 part of the gradients; under 3 part of the parameters)."""
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
    if len(sys.argv) > 2:  # one parameter: fewer than the ranks
        model = lockstep.nn.Sequential(lockstep.nn.Linear(8, 3, bias=False))
    dp = lockstep.dist.DataParallel(model)
    if sys.argv[1] == "zero3":
        opt = lockstep.dist.fully_shard(model, lockstep.optim.AdamW, lr=0.01, weight_decay=0.1)
    elif sys.argv[1] == "zero2":  # buckets of one gradient, two reduces in flight at a time
        opt = lockstep.dist.ZeroRedundancyOptimizer(model.parameters(), lockstep.optim.AdamW,
                                                     stage=2, bucket_bytes=64, lr=0.01,
                                                     weight_decay=0.1)
    elif sys.argv[1] == "zero":
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
    if sys.argv[1].startswith("zero"):
        print("rank %d state %d" % (rank, opt.local_state_numel()), flush=True)
        print("rank %d grads %d" % (rank, opt.local_grad_numel()), flush=True)
        print("rank %d runs %s" % (rank, [opt.run(i) for i in range(len(opt.params()))]),
              flush=True)
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
    with pytest.raises(lockstep.Error, match="stage 3"):
        lockstep.dist.ZeroRedundancyOptimizer([lockstep.zeros(2)], lockstep.optim.SGD, stage=3,
                                              lr=0.1)
    assert lockstep.dist.ZeroRedundancyOptimizer([lockstep.zeros(2)], lockstep.optim.SGD,
                                                 stage=2, lr=0.1).stage == 2
    with pytest.raises(lockstep.Error, match="bucket_bytes 0"):
        lockstep.dist.ZeroRedundancyOptimizer([lockstep.zeros(2)], lockstep.optim.SGD,
                                              stage=2, bucket_bytes=0, lr=0.1)


def test_fully_shard_alone_trains_as_the_optimizer_it_wraps():
    def train(shard, **options):
        lockstep.manual_seed(2)
        model = lockstep.nn.Sequential(lockstep.nn.Linear(5, 4), lockstep.nn.Tanh(),
                                       lockstep.nn.Linear(4, 2))
        if shard:
            opt = lockstep.dist.fully_shard(model, lockstep.optim.Adam, lr=0.05, **options)
        else:
            opt = lockstep.optim.Adam(model.parameters(), lr=0.05)
        scale = lockstep.ones(2, requires_grad=True)  # a group added later is sharded too
        opt.add_param_group({"params": [scale], "lr": 0.1})
        for s in range(3):
            with lockstep.step():
                opt.zero_grad()
                ((model(lockstep.ones(2, 5) * (s + 1)) * scale) ** 2).sum().backward()
                opt.step()
        return [p.numpy() for p in model.parameters()] + [scale.numpy()], opt

    want, _ = train(False)
    got, opt = train(True)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(want, train(True, reshard_after_forward=False)[0]):
        np.testing.assert_array_equal(a, b)
    assert opt.stage == 3 and isinstance(opt.local_optimizer, lockstep.optim.Adam)
    twice = lockstep.nn.Linear(2, 2)
    lockstep.dist.fully_shard(twice, lockstep.optim.SGD, lr=0.1)
    with pytest.raises(lockstep.Error, match="sharded already"):
        lockstep.dist.fully_shard(twice, lockstep.optim.SGD, lr=0.1)


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


def test_an_asynchronous_save_holds_the_values_of_its_step(tmp_path):
    lockstep.manual_seed(4)
    model = lockstep.nn.Linear(3, 2)
    opt = lockstep.dist.ZeroRedundancyOptimizer(model.parameters(), lockstep.optim.SGD, lr=0.5)

    def train(steps):
        for _ in range(steps):
            with lockstep.step():
                opt.zero_grad()
                (model(lockstep.ones(4, 3)) ** 2).sum().backward()
                opt.step()

    train(2)
    saved = [p.numpy().copy() for p in model.parameters()]
    lockstep.dist.save_sharded_async(str(tmp_path / "ck"), model, opt, metadata={"step": "2"})
    train(3)  # updates the parameters in place while the writer may still write
    lockstep.dist.wait_for_save()
    assert os.path.exists(tmp_path / "ck" / "index.safetensors")
    fresh = lockstep.nn.Linear(3, 2)
    assert lockstep.dist.load_sharded(str(tmp_path / "ck"), fresh)["step"] == "2"
    for a, b in zip(saved, fresh.parameters()):
        np.testing.assert_array_equal(a, b.numpy())
    assert not np.array_equal(saved[0], model.weight.numpy())
    lockstep.dist.wait_for_save()  # nothing in flight: returns


def test_the_exit_waits_for_an_asynchronous_save(tmp_path):
    script = textwrap.dedent("""
        import sys
        import lockstep
        model = lockstep.nn.Linear(256, 256)
        lockstep.dist.save_sharded_async(sys.argv[1], model)
        # no wait: the interpreter's exit waits for the writer
    """)
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ck")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    fresh = lockstep.nn.Linear(256, 256)
    lockstep.dist.load_sharded(str(tmp_path / "ck"), fresh)


def read_safetensors(path):
    """The tensors of a safetensors file, as the format's specification lays them out (the
    `safetensors` package is not among Debian's)."""
    import json
    import struct
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    kinds = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}
    data = raw[8 + n:]
    out = {name: np.frombuffer(data[e["data_offsets"][0]:e["data_offsets"][1]],
                               dtype=kinds[e["dtype"]]).reshape(e["shape"])
           for name, e in header.items()}
    return out, meta


def test_the_export_loads_into_pytorch(tmp_path):
    torch = pytest.importorskip("torch")
    lockstep.manual_seed(3)
    model = lockstep.nn.Sequential(lockstep.nn.Linear(4, 8), lockstep.nn.ReLU(),
                                   lockstep.nn.Linear(8, 2))
    opt = lockstep.dist.ZeroRedundancyOptimizer(model.parameters(), lockstep.optim.AdamW, lr=0.1)
    with lockstep.step():
        opt.zero_grad()
        model(lockstep.ones(2, 4)).sum().backward()
        opt.step()
    lockstep.dist.save_sharded(str(tmp_path / "ck"), model, opt, metadata={"step": "1"})
    meta = lockstep.dist.export_safetensors(str(tmp_path / "ck"), str(tmp_path / "model.st"))
    assert meta == {"step": "1"}
    tensors, file_meta = read_safetensors(tmp_path / "model.st")
    assert file_meta["format"] == "pt" and file_meta["step"] == "1"
    peer = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    peer.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()}, strict=True)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    want = model(lockstep.tensor(x)).numpy()
    np.testing.assert_allclose(peer(torch.from_numpy(x)).detach().numpy(), want, rtol=1e-6,
                               atol=1e-6)
    with pytest.raises(lockstep.Error, match="holds no index"):
        lockstep.dist.export_safetensors(str(tmp_path), str(tmp_path / "x.st"))


def run_two_ranks(tmp_path, *args):
    """SCRIPT's output on two ranks under mpirun, per mode: plain (DataParallel with the whole
    optimizer), zero, zero2 and zero3; `args` follow the mode on its command line."""
    script = tmp_path / "zero.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    outs = {}
    for mode in ("plain", "zero", "zero2", "zero3"):
        cmd = ["mpirun", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH", "-x",
               "OMP_NUM_THREADS", sys.executable, str(script), mode, *args]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        outs[mode] = r.stdout
    return outs


def losses_of(outs):
    # mpirun forwards each rank's output in the chunks it reads: two ranks' lines can land on one
    # line of the merged stream, so records are found anywhere.
    return {m: sorted(re.findall(r"rank \d step \d loss [0-9.e+-]+", o)) for m, o in outs.items()}


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")
def test_two_ranks_train_as_data_parallel_and_split_the_state(tmp_path):
    outs = run_two_ranks(tmp_path)
    losses = losses_of(outs)
    hashes = {m: set(re.findall(r"hash ([0-9a-f]{16})", o)) for m, o in outs.items()}
    params = 8 * 16 + 16 + 16 * 3 + 3
    for zero in ("zero", "zero2", "zero3"):
        assert len(losses[zero]) == 8 and losses[zero] == losses["plain"], outs
        assert len(hashes[zero]) == 1 and hashes[zero] == hashes["plain"], outs
        state = [int(n) for n in re.findall(r"rank \d state (\d+)", outs[zero])]
        # AdamW: two moments per element
        assert len(state) == 2 and min(state) > 0 and sum(state) == 2 * params, outs[zero]
    # Stage 1 keeps every gradient on each rank; stage 2 each rank those of its shard alone.
    assert re.findall(r"rank \d grads (\d+)", outs["zero"]) == [str(params)] * 2, outs["zero"]
    # Stage 2 and 3 (fully_shard, the parameters sharded too): each rank those of its shard alone.
    for zero in ("zero2", "zero3"):
        grads = [int(n) for n in re.findall(r"rank \d grads (\d+)", outs[zero])]
        assert len(grads) == 2 and min(grads) > 0 and sum(grads) == params, outs[zero]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")
def test_one_parameter_on_two_ranks_is_split_under_every_stage(tmp_path):
    """One parameter on two ranks, so no rank could own a parameter whole and the others share
    the work: under every stage the parameter, larger than an even share, is split (each rank one
    run of 12 elements of the 24; under stage 3 the parameter itself too, gathered from the
    runs). Every stage trains as DataParallel."""
    outs = run_two_ranks(tmp_path, "one")
    losses = losses_of(outs)
    for zero in ("zero", "zero2", "zero3"):
        assert len(losses[zero]) == 8 and losses[zero] == losses["plain"], outs
        state = sorted(int(n) for n in re.findall(r"rank \d state (\d+)", outs[zero]))
        assert state == [8 * 3, 8 * 3], outs[zero]
        # Bounded by its bracket: the two ranks' lines may reach mpirun's output interleaved, one
        # line's newline after the other line ("...runs [(0, 12)]rank 1 runs [(12, 12)]\n\n").
        runs = sorted(re.findall(r"rank \d runs (\[[^]]*\])", outs[zero]))
        assert runs == ["[(0, 12)]", "[(12, 12)]"], outs[zero]
