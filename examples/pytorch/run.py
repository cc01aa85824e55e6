"""Runs one of the PyTorch programs ported here (word_language_model with an LSTM or a
Transformer, nanoGPT's train.py) on a small text it writes, under lockstep or, the same source,
under PyTorch: there `lockstep` and `lockstep.nn` are PyTorch's modules (with `step` a no-op and
`amp.GradScaler` PyTorch's), so the two runs differ only by the framework. It records each loss
the model computes and when, and can start the model from given weights (a state_dict of NumPy
arrays) and fix the batches nanoGPT samples: python/tests/test_pytorch_ports.py compares the two
runs' losses, scripts/bench-programs times them.
    python3 examples/pytorch/run.py <wlm_lstm|wlm_transformer|nanogpt> <lockstep|pytorch> [steps=10]
        [threads]
prints "result <program> <framework> ms <median ms per training step> first <first step ms>
loss <last training loss>", as bench/user_programs.py does.
"""
import contextlib
import os
import pickle
import runpy
import sys
import tempfile
import time
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = ("wlm_lstm", "wlm_transformer", "nanogpt")
WORDS = ["the", "a", "model", "learns", "to", "predict", "next", "word", "from", "text", "of",
         "small", "size", "and", "runs", "each", "step", "as", "one", "program", "lazy", "tensor",
         "loss", "falls", "slowly", "when", "rate", "is", "low", "high", "batch", "sequence"]


def make_text(path, lines, seed):
    """`lines` lines of 4 to 11 words drawn from WORDS, the same for a given seed."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(lines):
            f.write(" ".join(rng.choice(WORDS, size=int(rng.integers(4, 12)))) + "\n")


def make_data(workdir, lines=24):
    """word_language_model's corpus (train.txt, valid.txt, test.txt) in workdir/wlm, and nanoGPT's
    (train.bin, val.bin, meta.pkl, made from the same text as data/shakespeare_char/prepare.py
    makes them) in workdir/chars."""
    wlm, chars = os.path.join(workdir, "wlm"), os.path.join(workdir, "chars")
    os.makedirs(wlm, exist_ok=True)
    os.makedirs(chars, exist_ok=True)
    for name, n, seed in (("train", lines, 1), ("valid", max(lines // 4, 6), 2),
                          ("test", max(lines // 4, 6), 3)):
        make_text(os.path.join(wlm, name + ".txt"), n, seed)
    data = open(os.path.join(wlm, "train.txt")).read()
    stoi = {ch: i for i, ch in enumerate(sorted(set(data)))}
    n = len(data)
    for name, part in (("train", data[:int(n * 0.9)]), ("val", data[int(n * 0.9):])):
        ids = np.array([stoi[c] for c in part], dtype=np.uint16)
        ids.tofile(os.path.join(chars, name + ".bin"))
    with open(os.path.join(chars, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": len(stoi), "itos": {i: c for c, i in stoi.items()},
                     "stoi": stoi}, f)
    return wlm, chars


def argv_of(program, workdir, steps, micro_steps):
    """The program's command line: small sizes, dropout 0, `steps` training steps (a few more for
    word_language_model, whose epochs cover the text), nanoGPT's of `micro_steps` micro-steps."""
    if program.startswith("wlm"):
        model = {"wlm_lstm": "LSTM", "wlm_transformer": "Transformer", "wlm_rnn_tanh": "RNN_TANH",
                 "wlm_rnn_relu": "RNN_RELU"}[program]
        return ["main.py", "--data", os.path.join(workdir, "wlm"), "--model", model,
                "--emsize", "32", "--nhid", "32", "--nlayers", "2", "--nhead", "2",
                "--bptt", "8", "--batch_size", "4", "--dropout", "0", "--lr", "5",
                "--epochs", str(max(1, steps // 4)), "--log-interval", "2",
                "--save", os.path.join(workdir, "model.pt")]
    return ["train.py", "--dataset=" + os.path.join(workdir, "chars"),
            "--out_dir=" + os.path.join(workdir, "out"), "--batch_size=4", "--block_size=16",
            "--n_layer=2", "--n_head=2", "--n_embd=32", "--max_iters=%d" % steps,
            "--eval_interval=%d" % max(2, steps // 2), "--eval_iters=2",
            "--gradient_accumulation_steps=%d" % micro_steps, "--warmup_iters=2",
            "--lr_decay_iters=%d" % steps, "--learning_rate=0.001", "--min_lr=0.0001"]


def _pytorch_modules():
    """PyTorch's modules under the names the ports import."""
    import torch

    class Torch(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch, name)

    shim = Torch("lockstep")
    shim.step = contextlib.nullcontext
    shim.amp = types.SimpleNamespace(GradScaler=torch.cuda.amp.GradScaler)
    return torch, {"lockstep": shim, "lockstep.nn": torch.nn,
                   "lockstep.nn.functional": torch.nn.functional}


def run(program, framework, workdir, steps, initial=None, batches_seed=None, on_model=None,
        micro_steps=2):
    """Runs the program as __main__ in this process; returns (losses, times, state): each loss
    the model computed (floats, in order), the time of each training forward (seconds), and the
    model's state_dict as built (NumPy arrays), before `initial` (if given) replaced it.
    batches_seed fixes nanoGPT's batch sampling (torch.randint) to a NumPy generator's draws;
    on_model(model) is called once the model is built."""
    directory = os.path.join(HERE, "word_language_model" if program.startswith("wlm") else
                             "nanogpt")
    saved_modules = dict(sys.modules)  # the entries this run replaces are put back
    saved = (list(sys.path), list(sys.argv), os.getcwd())
    patched = []
    records, times, state = [], [], {}

    def patch(obj, name, value):
        patched.append((obj, name, obj.__dict__.get(name, patch)))
        setattr(obj, name, value)

    try:
        if framework == "pytorch":
            fw, modules = _pytorch_modules()
            sys.modules.update(modules)
        else:
            import lockstep as fw
        for name in ("model", "data"):
            sys.modules.pop(name, None)
        sys.path.insert(0, directory)
        os.chdir(directory)
        sys.argv = argv_of(program, workdir, steps, micro_steps)
        import model as port  # the port's model.py, as its script imports it

        def after_init(cls):
            init = cls.__init__

            def wrapped(self, *args, **kwargs):
                init(self, *args, **kwargs)
                if type(self) is not cls:
                    return
                state.update({k: np.array(v.detach().numpy()) for k, v in
                              self.state_dict().items()})
                if initial is not None:
                    own = self.state_dict()
                    self.load_state_dict({k: fw.from_numpy(np.array(v)) for k, v in
                                          initial.items() if k in own})
                if on_model is not None:
                    on_model(self)
            patch(cls, "__init__", wrapped)

        def recording(cls, loss_of):
            forward = cls.forward

            def wrapped(self, *args, **kwargs):
                out = forward(self, *args, **kwargs)
                if self.training and fw.is_grad_enabled():
                    times.append(time.perf_counter())
                records.append(loss_of(out))
                return out
            patch(cls, "forward", wrapped)

        if program.startswith("wlm"):
            for cls in (port.RNNModel, port.TransformerModel):
                after_init(cls)
            recording(fw.nn.NLLLoss, lambda loss: loss)
        else:
            after_init(port.GPT)
            recording(port.GPT, lambda out: out[1])
            if batches_seed is not None:
                rng = np.random.default_rng(batches_seed)
                patch(fw, "randint",
                      lambda high, size: fw.from_numpy(rng.integers(0, high, size)))
        runpy.run_path(os.path.join(directory, sys.argv[0]), run_name="__main__")
        return [float(r.item()) for r in records if r is not None], times, state
    finally:
        for obj, name, old in reversed(patched):
            if old is patch:
                delattr(obj, name)
            else:
                setattr(obj, name, old)
        sys.path[:], sys.argv[:] = saved[0], saved[1]
        os.chdir(saved[2])
        # The port's modules and the stand-ins go; whatever else the run imported stays.
        for name in ("model", "data", "lockstep", "lockstep.nn", "lockstep.nn.functional"):
            sys.modules.pop(name, None)
            if name in saved_modules:
                sys.modules[name] = saved_modules[name]


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in PROGRAMS or sys.argv[2] not in ("lockstep",
                                                                                 "pytorch"):
        sys.exit(__doc__)
    program, framework = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    if len(sys.argv) > 4:
        if framework == "pytorch":
            import torch as fw
        else:
            import lockstep as fw
        fw.set_num_threads(int(sys.argv[4]))
    with tempfile.TemporaryDirectory() as workdir:
        make_data(workdir, lines=24 * max(1, steps // 8))
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            losses, times, _ = run(program, framework, workdir, steps, micro_steps=1)
    # A training step is the time from one training forward to the next (one forward a step;
    # each program reads its loss every step, so a step's time includes running it); the first
    # includes compiling.
    gaps = np.diff(times) * 1000
    ms, first = float(np.median(gaps[1:])), gaps[0]
    print("result %s %s ms %.3f first %.0f loss %.4f" % (program, framework, ms, first,
                                                        losses[-1]))


if __name__ == "__main__":
    main()
