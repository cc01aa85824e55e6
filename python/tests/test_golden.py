"""Values against the golden fixtures made with PyTorch (tests/golden/), from Python."""
import os

import pytest

import lockstep
from conftest import SOURCE_DIR, step_site

GOLDEN = os.path.join(SOURCE_DIR, "tests", "golden")


def test_gpt_losses_match_pytorch_over_five_adamw_steps():
    f = lockstep.load_file(os.path.join(GOLDEN, "gpt_training.safetensors"))
    model = lockstep.models.GPT()
    model.load_state_dict({k[len("init."):]: v for k, v in f.items() if k.startswith("init.")})
    opt = lockstep.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    want = f["losses"].tolist()
    lockstep.metrics.reset()
    xs, ys = lockstep.unbind(f["x"], 0), lockstep.unbind(f["y"], 0)
    for s, (x, y) in enumerate(zip(xs, ys)):
        x, y = x.to("cpu"), y.to("cpu")
        with lockstep.step():  # THE STEP
            logits = model(x)
            loss = lockstep.nn.functional.cross_entropy(logits.reshape(-1, model.vocab_size),
                                                        y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert loss.item() == pytest.approx(want[s], rel=1e-4), f"step {s + 1}"
    # The first step compiles, the second too (AdamW's state now exists), the rest hit the cache.
    site = step_site(__file__, "THE STEP")
    assert 1 <= site["compiles"] <= 2, site
    assert site["compiles"] + site["cache_hits"] == 5 and site["cache_hits"] >= 3, site


def test_graph_dumps_name_the_python_lines():
    x = lockstep.randn(3, 3)
    y = (x @ x).relu()  # THE DUMP LINE
    lockstep.sync()
    lockstep.wait()
    line = [i for i, s in enumerate(open(__file__), 1) if s.rstrip().endswith("# THE DUMP LINE")][0]
    assert f"test_golden.py:{line}" in lockstep.debug.last_graph_text()
    del y
