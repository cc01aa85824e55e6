#!/usr/bin/env bash
# `pip install .` from a fresh virtual environment (Debian's python3), then, from a folder outside
# the checkout: `import lockstep`, lockstep-train on the environment's PATH, and
# examples/train_resnet_fake.py; then `pip wheel .` and that wheel installed into a second fresh
# environment. The build folder (build/pip in the checkout) is kept between runs, and ccache
# serves what the release build compiled already.
#   tests/install/pip_install_test.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src="$1"
work="$2"
rm -rf "$work"
mkdir -p "$work/outside"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
unset PYTHONPATH

/usr/bin/python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$src"

cd "$work/outside"
"$work/venv/bin/python" - <<'PY'
import lockstep, os, sys
where = os.path.dirname(lockstep.__file__)
assert where.startswith(sys.prefix), where  # the installed package, not the checkout's
x = lockstep.ones(2, 3)
assert (x * 2).sum().item() == 12.0
print("import lockstep from", where)
PY
PATH="$work/venv/bin:$PATH" lockstep-train --model mlp --data fake --num-epochs 1 --num-steps 3 \
  --batch-size 8 --log-steps 1 > train.log
grep -q "step: 2" train.log || { cat train.log; exit 1; }
echo "lockstep-train on the environment's PATH: ok"
"$work/venv/bin/python" "$src/examples/train_resnet_fake.py" --steps 3 --batch 2 > example.log
grep -q "epoch: 1, step: 0, loss: " example.log && grep -q "^compiles: " example.log || { cat example.log; exit 1; }
echo "examples/train_resnet_fake.py from outside the checkout: ok"

"$work/venv/bin/pip" wheel -q --no-deps -w "$work/wheels" "$src"
/usr/bin/python3 -m venv "$work/venv2"
"$work/venv2/bin/pip" install -q "$work"/wheels/lockstep-*.whl
"$work/venv2/bin/python" -c "import lockstep; assert lockstep.tensor([1, 2]).sum().item() == 3"
test -x "$work/venv2/bin/lockstep-train"
echo "pip wheel, installed into another environment: ok"
