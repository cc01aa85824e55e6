"""The seed's ResNet training loop (torch_xla's examples/train_resnet_base.py) in lockstep.

Fake ImageNet-like data, ResNet-18, SGD; each iteration is one `with lockstep.step():`, and every
10 steps a step closure prints the seed's line:

    epoch: 1, step: 10, loss: 6.9012, rate: 9.53

Under `mpirun -np N python3 examples/train_resnet_fake.py` each rank trains a replica in data
parallel (lockstep.dist.DataParallel) on its shard and prints its own lines, as the seed does.

    python3 examples/train_resnet_fake.py [--steps 30] [--batch 8] [--image-size 32]
"""

import argparse
import itertools
import sys
import time

import lockstep


class RateTracker:
    """torch_xla's RateTracker: samples per second since the last report, smoothed (0.6 new)."""

    def __init__(self, smooth_factor=0.4):
        self._smooth = smooth_factor
        self._start = time.time()
        self._partial = 0
        self._rate = None

    def add(self, count):
        self._partial += count

    def rate(self):
        now = time.time()
        current = self._partial / max(now - self._start, 1e-9)
        self._rate = current if self._rate is None else (
            (1 - self._smooth) * current + self._smooth * self._rate)
        self._start, self._partial = now, 0
        return self._rate


class TrainResNetBase:
    def __init__(self, steps, batch_size, image_size):
        lockstep.dist.init()  # one process, or a rank under mpirun
        self.num_steps = steps
        self.batch_size = batch_size
        self.num_epochs = 1
        world = lockstep.dist.world_size()
        lockstep.manual_seed(0)
        dataset = lockstep.data.dataset("fake", shape=(3, image_size, image_size),
                                        num_classes=1000, size=steps * batch_size * world)
        self.train_loader = lockstep.data.DataLoader(dataset, batch_size=batch_size,
                                                     drop_last=True, num_workers=1)
        self.model = lockstep.models.resnet18(num_classes=1000, small_stem=image_size <= 64)
        # Rank 0's parameters on every rank; gradients averaged across ranks in run_optimizer.
        self.data_parallel = lockstep.dist.DataParallel(self.model) if world > 1 else None
        self.optimizer = lockstep.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss_fn = lockstep.nn.CrossEntropyLoss()

    def run_optimizer(self):
        if self.data_parallel is not None:
            self.data_parallel.average_gradients()
        self.optimizer.step()

    def _train_update(self, step, loss, tracker, epoch):
        print(f"epoch: {epoch}, step: {step}, loss: {loss.item()}, rate: {tracker.rate()}",
              flush=True)

    def train_loop_fn(self, loader, epoch):
        tracker = RateTracker()
        self.model.train()
        loader = itertools.islice(loader, self.num_steps)
        for step, (data, target) in enumerate(loader):
            with lockstep.step():
                self.optimizer.zero_grad()
                output = self.model(data)
                loss = self.loss_fn(output, target)
                loss.backward()
                self.run_optimizer()
                # Closures run after the step's program, with its values ready.
                lockstep.add_step_closure(tracker.add, args=(self.batch_size,))
                if step % 10 == 0:
                    lockstep.add_step_closure(self._train_update,
                                              args=(step, loss, tracker, epoch))

    def start_training(self):
        for epoch in range(1, self.num_epochs + 1):
            self.train_loop_fn(self.train_loader, epoch)
        lockstep.wait()
        compiles = lockstep.metrics.counter("compiles")
        hits = lockstep.metrics.counter("cache_hits")
        implicit = lockstep.metrics.counter("implicit_syncs")
        print(f"compiles: {compiles}, cache hits: {hits}, implicit syncs: {implicit}", flush=True)
        return 0 if implicit == 0 else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=32)
    args = parser.parse_args()
    if args.steps < 1 or args.batch < 1 or args.image_size < 8:
        parser.error("--steps and --batch must be >= 1, --image-size >= 8")
    return TrainResNetBase(args.steps, args.batch, args.image_size).start_training()


if __name__ == "__main__":
    sys.exit(main())
