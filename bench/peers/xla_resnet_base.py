"""The seed's loop in torch_xla itself: examples/train_resnet_base.py as the seed's pull request
left it (each iteration in `torch_xla.step()`, fake data from xu.SampleGenerator moved by
pl.MpDeviceLoader, torchvision's ResNet-50, SGD with weight decay 1e-4, a step closure printing
"epoch: E, step: S, loss: L, rate: R" every 10 steps), on torch_xla's CPU device
(PJRT_DEVICE=CPU), with the image side, batch and steps as arguments so that two cores finish
it; scripts/bench-seed runs it against `lockstep-train --model resnet50 --data fake`. At the end
prints "total: images/s X" over the steps after the first 10 (compiles excluded, as the seed's
rate lines exclude nothing but smooth them) and the seconds to the end of step 10.
    PJRT_DEVICE=CPU python bench/peers/xla_resnet_base.py [--steps 40] [--batch 16]
                                                          [--image-size 64]
"""
import argparse
import itertools
import time

import torch
import torch.nn as nn
import torch.optim as optim
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.utils.utils as xu
import torchvision
from torch_xla import runtime as xr


class TrainResNetBase():

  def __init__(self, img_dim, batch_size, num_steps):
    self.img_dim = img_dim
    self.batch_size = batch_size
    self.num_steps = num_steps
    self.num_epochs = 1
    self.train_dataset_len = 1200000  # Roughly the size of Imagenet dataset.
    # For the purpose of this example, we are going to use fake data.
    train_loader = xu.SampleGenerator(
        data=(torch.zeros(self.batch_size, 3, self.img_dim, self.img_dim),
              torch.zeros(self.batch_size, dtype=torch.int64)),
        sample_count=self.train_dataset_len // self.batch_size // xr.world_size())

    self.device = torch_xla.device()
    self.train_device_loader = pl.MpDeviceLoader(train_loader, self.device)
    self.model = torchvision.models.resnet50().to(self.device)
    self.optimizer = optim.SGD(self.model.parameters(), lr=0.01, weight_decay=1e-4)
    self.loss_fn = nn.CrossEntropyLoss()
    self.times = []

  def _train_update(self, step, loss, tracker, epoch):
    print(f'epoch: {epoch}, step: {step}, loss: {loss}, rate: {tracker.rate()}', flush=True)

  def run_optimizer(self):
    self.optimizer.step()

  def train_loop_fn(self, loader, epoch):
    tracker = xm.RateTracker()
    self.model.train()
    loader = itertools.islice(loader, self.num_steps)
    for step, (data, target) in enumerate(loader):
      with torch_xla.step():
        self.optimizer.zero_grad()
        output = self.model(data)
        loss = self.loss_fn(output, target)
        loss.backward()
        self.run_optimizer()

      tracker.add(self.batch_size)
      if step % 10 == 0:
        xm.add_step_closure(self._train_update, args=(step, loss, tracker, epoch))
      if step == 10:
        xm.wait_device_ops()
        self.times.append(time.perf_counter())

  def start_training(self):
    start = time.perf_counter()
    for epoch in range(1, self.num_epochs + 1):
      self.train_loop_fn(self.train_device_loader, epoch)
    xm.wait_device_ops()
    end = time.perf_counter()
    if self.times and self.num_steps > 11:
      rate = (self.num_steps - 11) * self.batch_size / (end - self.times[0])
      print(f'total: images/s {rate:.2f} (steps 11-{self.num_steps - 1}), '
            f'to the end of step 10: {self.times[0] - start:.1f} s', flush=True)


if __name__ == '__main__':
  parser = argparse.ArgumentParser()
  parser.add_argument('--steps', type=int, default=40)
  parser.add_argument('--batch', type=int, default=16)
  parser.add_argument('--image-size', type=int, default=64)
  parser.add_argument('--threads', type=int, default=2)
  args = parser.parse_args()
  torch.set_num_threads(args.threads)
  torch.manual_seed(0)
  TrainResNetBase(args.image_size, args.batch, args.steps).start_training()
