"""A small GPT on a synthetic next-token task, from Python (examples/train_gpt.cpp's loop).

Sequences x_t = (a + b t) mod 16 with a random start a and stride b in {1, 2, 3}: the model must
read the stride from the context. Batches are drawn inside the step from lockstep's generator
(no host data, no recompiles). Prints "epoch, step, loss, rate" every 25 steps from a step
closure, then the next-token accuracy; exit status 0 when it learned (accuracy >= 0.9).

    python3 examples/train_gpt.py [--steps 300]
"""

import argparse
import sys
import time

import lockstep
import lockstep.nn.functional as F

BATCH, LENGTH = 32, 24


def sequences(vocab):
    a = lockstep.randint(0, vocab, (BATCH, 1))
    b = lockstep.randint(1, 4, (BATCH, 1))
    return lockstep.remainder(a + b * lockstep.arange(LENGTH + 1), vocab)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    lockstep.manual_seed(2026)
    model = lockstep.models.GPT()  # vocab 16, d_model 64, 4 heads, 2 layers
    vocab = model.vocab_size
    opt = lockstep.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = lockstep.optim.lr_scheduler.CosineWarmupLR(opt, 20, args.steps, 1e-4)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"GPT: {parameters} parameters, batch {BATCH} x {LENGTH} tokens, {args.steps} steps")
    start = time.time()
    for step in range(1, args.steps + 1):
        with lockstep.step():
            seq = sequences(vocab)
            x, y = seq[:, :LENGTH], seq[:, 1:]
            loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            lockstep.optim.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step % 25 == 0 or step == args.steps:
                rate = step * BATCH / (time.time() - start)
                lockstep.add_step_closure(
                    lambda s, l, r: print(f"epoch: 1, step: {s}, loss: {l.item():.4f}, "
                                          f"rate: {r:.1f} sequences/s", flush=True),
                    args=(step, loss, rate))
        schedule.step()

    model.eval()
    with lockstep.no_grad():
        seq = sequences(vocab)
        x, y = seq[:, :LENGTH], seq[:, 1:]
        hit = (model(x).argmax(-1) == y)[:, 2:]
        accuracy = hit.sum().item() / hit.numel()
    print(f"final loss: {loss.item():.4f}, next-token accuracy: {accuracy:.3f}")
    print(f"compiles: {lockstep.metrics.counter('compiles')}, "
          f"cache hits: {lockstep.metrics.counter('cache_hits')}")
    return 0 if accuracy >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
