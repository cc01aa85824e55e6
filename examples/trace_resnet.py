"""A timeline of real ResNet-18 training steps (batch 8, 64x64 fake images, SGD with momentum),
traced at the fine level after two warm-up steps, as docs/step-timeline.svg shows it:

    PYTHONPATH=build/release/python python3 examples/trace_resnet.py traces
    scripts/trace-svg traces/lockstep-*.trace.json docs/step-timeline.svg

Open the .json file in https://ui.perfetto.dev to explore it."""
import sys

import lockstep
import lockstep.nn.functional as F

model = lockstep.models.resnet18(num_classes=10)
opt = lockstep.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = lockstep.randn(8, 3, 64, 64), lockstep.randint(0, 10, (8,))


def step():
    with lockstep.step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


step()
step()  # compiled and cached: the traced steps are cache hits
lockstep.wait()
with lockstep.profiler.trace(sys.argv[1] if len(sys.argv) > 1 else "traces", level="fine") as t:
    step()
    step()
print(t.path)
