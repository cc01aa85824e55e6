"""TensorBoard event files (lockstep.SummaryWriter, lockstep-train --tensorboard), read back by
TensorBoard's own reader (tensorboard.backend.event_processing) in the virtual environment that
scripts/install-deps makes (LOCKSTEP_TOOLS_VENV): tags, steps and values, exactly as float32, and
every record byte for byte as TensorBoard's protobuf classes serialize it."""
import json
import os
import struct
import subprocess

import pytest

import lockstep

# Run by the environment's python: prints, for each run directory under the argument, its
# scalars and text as EventAccumulator gives them, and whether every record of its files is the
# canonical serialization of the tensorflow.Event it parses to.
READER = r"""
import json, os, sys
from tensorboard.backend.event_processing import event_accumulator, event_file_loader
from tensorboard.compat.proto import event_pb2

root = sys.argv[1]
out = {}
for d, _, files in sorted(os.walk(root)):
    events = sorted(f for f in files if "tfevents" in f)
    if not events:
        continue
    acc = event_accumulator.EventAccumulator(
        d, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    canonical, records = True, 0
    for f in events:
        for raw in event_file_loader.RawEventFileLoader(os.path.join(d, f)).Load():
            records += 1
            canonical &= event_pb2.Event.FromString(raw).SerializeToString() == raw
    first = next(event_file_loader.LegacyEventFileLoader(os.path.join(d, events[0])).Load())
    out[os.path.relpath(d, root)] = {
        "files": events,
        "records": records,
        "canonical": canonical,
        "file_version": first.file_version,
        "scalars": {t: [[e.step, e.value, e.wall_time] for e in acc.Scalars(t)]
                    for t in tags["scalars"]},
        "text": {t: [[e.step, [s.decode() for s in e.tensor_proto.string_val],
                      e.tensor_proto.dtype, [d.size for d in e.tensor_proto.tensor_shape.dim],
                      acc.SummaryMetadata(t).plugin_data.plugin_name]
                     for e in acc.Tensors(t)] for t in tags["tensors"]},
    }
json.dump(out, sys.stdout)
"""


def read_runs(log_dir):
    venv = os.environ.get("LOCKSTEP_TOOLS_VENV")
    assert venv, "LOCKSTEP_TOOLS_VENV is not set: run the tests through ctest"
    python = os.path.join(venv, "bin", "python")
    assert os.path.exists(python), (
        "%s is missing: scripts/install-deps makes it (tensorboard's reader)" % python)
    r = subprocess.run([python, "-c", READER, str(log_dir)], capture_output=True, text=True,
                       timeout=300, env={"PATH": os.environ.get("PATH", "")})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def test_scalars_scalars_and_text_as_tensorboard_reads_them(tmp_path):
    with lockstep.SummaryWriter(tmp_path / "run", filename_suffix=".v1") as w:
        assert w.log_dir == str(tmp_path / "run") == w.get_logdir()
        assert os.path.basename(w.file_name).startswith("events.out.tfevents.")
        assert ".%d." % os.getpid() in w.file_name and w.file_name.endswith(".v1")
        for step in range(5):
            w.add_scalar("loss", 1.0 / (step + 1), step, walltime=1000.0 + step)
        w.add_scalar("lr", lockstep.tensor(0.1), global_step=7)  # a 0-d tensor, as torch's
        w.add_scalar("no_step", 3.25)
        w.add_scalars("loss/split", {"train": 0.7, "test": 0.9}, 3, walltime=2000.0)
        w.add_scalars("loss/split", {"train": 0.6, "test": 0.8}, 4)
        w.add_text("notes", "**bold** and ünïcode", 2)
        w.flush()
    with pytest.raises(lockstep.Error, match="closed"):
        w.add_scalar("loss", 1.0)

    runs = read_runs(tmp_path / "run")
    assert sorted(runs) == [".", "loss_split_test", "loss_split_train"]
    main = runs["."]
    assert main["canonical"] and main["file_version"] == "brain.Event:2"
    assert main["records"] == 1 + 5 + 1 + 1 + 1
    assert main["files"][0].endswith(".v1")
    s = main["scalars"]
    assert sorted(s) == ["loss", "lr", "no_step"]
    assert [(e[0], e[1], e[2]) for e in s["loss"]] == [
        (i, f32(1.0 / (i + 1)), 1000.0 + i) for i in range(5)]
    assert [(e[0], e[1]) for e in s["lr"]] == [(7, f32(0.1))]
    assert [(e[0], e[1]) for e in s["no_step"]] == [(0, 3.25)]
    # PyTorch's text(): "<tag>/text_summary", a DT_STRING (7) tensor of shape [1], plugin "text".
    assert main["text"] == {"notes/text_summary": [[2, ["**bold** and ünïcode"], 7, [1], "text"]]}
    for sub, values in (("loss_split_train", (0.7, 0.6)), ("loss_split_test", (0.9, 0.8))):
        run = runs[sub]
        assert run["canonical"] and run["records"] == 3
        assert [(e[0], e[1]) for e in run["scalars"]["loss/split"]] == [
            (3, f32(values[0])), (4, f32(values[1]))]
        assert run["scalars"]["loss/split"][0][2] == 2000.0


def test_purge_step_replaces_the_steps_a_resumed_run_redoes(tmp_path):
    with lockstep.SummaryWriter(tmp_path, max_queue=3) as w:
        for step in range(10):
            w.add_scalar("x", step, step)
    with lockstep.SummaryWriter(tmp_path, purge_step=5, flush_secs=0.01) as w:
        for step in range(5, 8):
            w.add_scalar("x", 100 + step, step)
    run = read_runs(tmp_path)["."]
    assert run["canonical"]
    assert [(e[0], e[1]) for e in run["scalars"]["x"]] == (
        [(i, float(i)) for i in range(5)] + [(i, 100.0 + i) for i in range(5, 8)])


def test_unwritable_log_dir_is_an_error_naming_it(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(lockstep.Error, match=str(tmp_path / "file" / "run")):
        lockstep.SummaryWriter(tmp_path / "file" / "run")


def write_idx(directory, prefix, images, labels):
    n = len(labels)
    with open(os.path.join(directory, prefix + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 2051, n, 28, 28) + bytes(images))
    with open(os.path.join(directory, prefix + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 2049, n) + bytes(labels))


def test_lockstep_train_logs_to_tensorboard(tmp_path):
    # A tiny MNIST-format dataset: class c has a bright band at rows 2c..2c+2.
    data = tmp_path / "data"
    data.mkdir()
    for prefix, n in (("train", 64), ("t10k", 32)):
        labels = [i % 10 for i in range(n)]
        images = []
        for i, c in enumerate(labels):
            images += [200 if 2 * c <= r < 2 * c + 3 else (i * 7 + r * 28 + col) % 40
                       for r in range(28) for col in range(28)]
        write_idx(str(data), prefix, images, labels)
    board = tmp_path / "board"
    exe = os.environ.get("LOCKSTEP_TRAIN_EXE")
    assert exe, "LOCKSTEP_TRAIN_EXE is not set: run the tests through ctest"
    r = subprocess.run(
        [exe, "--model", "mlp", "--data", "mnist:%s" % data, "--batch-size", "16",
         "--num-epochs", "2", "--log-steps", "1", "--lr", "0.01", "--lr-schedule", "constant",
         "--workers", "0", "--tensorboard", str(board)],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert r.returncode == 0, r.stdout + r.stderr
    printed = [line for line in r.stdout.splitlines() if ", loss: " in line]
    losses = [float(line.split("loss: ")[1].split(",")[0]) for line in printed]
    accuracies = [float(line.split("test_accuracy: ")[1]) for line in r.stdout.splitlines()
                  if "test_accuracy" in line]
    total_compiles = int(r.stdout.split("compiles ")[1].split(",")[0])
    assert len(losses) == 8 and len(accuracies) == 2, r.stdout

    runs = read_runs(board)
    assert list(runs) == ["."]
    run = runs["."]
    assert run["canonical"] and run["file_version"] == "brain.Event:2"
    s = run["scalars"]
    assert sorted(s) == ["runtime/cache_hits", "runtime/compiles", "test/accuracy", "test/loss",
                         "train/images_per_second", "train/learning_rate", "train/loss"]
    for tag in ("train/loss", "train/learning_rate", "train/images_per_second",
                "runtime/compiles", "runtime/cache_hits"):
        assert [e[0] for e in s[tag]] == list(range(8)), tag
    # The printed loss is the logged one, rounded to 4 places.
    assert all(abs(e[1] - p) <= 5.01e-5 for e, p in zip(s["train/loss"], losses))
    assert [e[1] for e in s["train/learning_rate"]] == [f32(0.01)] * 8
    assert all(e[1] > 0 for e in s["train/images_per_second"])
    compiles = [e[1] for e in s["runtime/compiles"]]
    hits = [e[1] for e in s["runtime/cache_hits"]]
    assert compiles == sorted(compiles) and 1 <= compiles[0] and compiles[-1] <= total_compiles
    assert hits == sorted(hits) and all(h == int(h) for h in hits + compiles)
    assert [e[0] for e in s["test/accuracy"]] == [4, 8]
    for e, printed_accuracy in zip(s["test/accuracy"], accuracies):
        assert abs(e[1] - printed_accuracy) <= 5.01e-5
        assert e[1] == f32(round(e[1] * 32) / 32)  # correct / 32 test images
