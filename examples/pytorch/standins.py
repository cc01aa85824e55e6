"""Stand-ins for what pytorch/examples' programs take from torchvision (datasets, transforms,
save_image) and from torch.utils.data (DataLoader), for the ports in this folder: the same
call signatures, over NumPy, yielding tensors of whichever framework `import lockstep` gives
(lockstep, or torch under as_pytorch.py). Not a data library: only what the ports call.

datasets.MNIST reads torchvision's files (<root>/MNIST/raw/*-idx?-ubyte, uncompressed); with
download=True and no files there it writes random digits in that format instead (there is no
network here), which is what the tests and benchmarks train on. datasets.FakeData is
torchvision's: random images, the same for a given index. DataLoader's shuffle draws from its own
NumPy generator (seed 0), so both frameworks see the same batches in the same order.
"""
import os
import struct

import numpy as np


def write_idx(path, array):
    """Writes a uint8 array in the idx format (MNIST's files)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 0x08, array.ndim))
        f.write(struct.pack(">" + "I" * array.ndim, *array.shape))
        f.write(array.tobytes())


def read_idx(path):
    with open(path, "rb") as f:
        zero, kind, ndim = struct.unpack(">HBB", f.read(4))
        if zero != 0 or kind != 0x08:
            raise ValueError(f"{path}: not an idx file of unsigned bytes")
        shape = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(shape)


def write_fake_mnist(root, train_size=640, test_size=200, seed=0):
    """Random 28x28 digits and labels in MNIST's files under <root>/MNIST/raw."""
    raw = os.path.join(root, "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    rng = np.random.default_rng(seed)
    for prefix, n in (("train", train_size), ("t10k", test_size)):
        write_idx(os.path.join(raw, f"{prefix}-images-idx3-ubyte"),
                  rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(os.path.join(raw, f"{prefix}-labels-idx1-ubyte"),
                  rng.integers(0, 10, (n,), dtype=np.uint8))


class _Datasets:
    class MNIST:
        def __init__(self, root, train=True, transform=None, target_transform=None,
                     download=False):
            raw = os.path.join(root, "MNIST", "raw")
            prefix = "train" if train else "t10k"
            images = os.path.join(raw, f"{prefix}-images-idx3-ubyte")
            if not os.path.exists(images):
                if not download:
                    raise RuntimeError(f"{images} not found: pass download=True to write "
                                       "random digits in MNIST's format there")
                print(f"no MNIST under {raw}: writing random digits in its format")
                write_fake_mnist(root)
            self.data = read_idx(images)
            self.targets = read_idx(os.path.join(raw, f"{prefix}-labels-idx1-ubyte"))
            self.transform = transform

        def __len__(self):
            return len(self.data)

        def __getitem__(self, i):
            image = self.data[i]
            return (self.transform(image) if self.transform else image), int(self.targets[i])

    class FakeData:
        def __init__(self, size=1000, image_size=(3, 224, 224), num_classes=10, transform=None,
                     target_transform=None, random_offset=0):
            self.size, self.image_size, self.num_classes = size, image_size, num_classes
            self.transform, self.random_offset = transform, random_offset

        def __len__(self):
            return self.size

        def __getitem__(self, i):
            rng = np.random.default_rng(i + self.random_offset)
            c, h, w = self.image_size
            image = rng.integers(0, 256, (h, w, c), dtype=np.uint8)  # HWC, as a PIL image
            target = int(rng.integers(0, self.num_classes))
            return (self.transform(image) if self.transform else image), target


class _Transforms:
    class Compose:
        def __init__(self, transforms):
            self.transforms = transforms

        def __call__(self, x):
            for t in self.transforms:
                x = t(x)
            return x

    class ToTensor:
        """uint8 [H, W] or [H, W, C] -> float32 [C, H, W] in [0, 1] (a NumPy array until the
        DataLoader makes the batch a tensor)."""

        def __call__(self, image):
            a = image.astype(np.float32) / 255
            return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)

    class Normalize:
        def __init__(self, mean, std):
            self.mean = np.asarray(mean, np.float32).reshape(-1, 1, 1)
            self.std = np.asarray(std, np.float32).reshape(-1, 1, 1)

        def __call__(self, x):
            return (x - self.mean) / self.std

    class Resize:
        def __init__(self, size):
            self.size = size

        def __call__(self, image):
            if image.shape[0] != self.size or image.shape[1] != self.size:
                raise NotImplementedError("the stand-in Resize keeps the size only")
            return image

    CenterCrop = Resize


datasets, transforms = _Datasets(), _Transforms()


class DataLoader:
    """torch.utils.data.DataLoader over a map-style dataset: batches of (image, label) stacked
    into tensors; workers and memory pinning are accepted and have no meaning here."""

    def __init__(self, dataset, batch_size=1, shuffle=False, num_workers=0, pin_memory=False,
                 drop_last=False, persistent_workers=False):
        self.dataset, self.batch_size = dataset, batch_size
        self.shuffle, self.drop_last = shuffle, drop_last
        self._rng = np.random.default_rng(0)

    def __len__(self):
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        import lockstep  # at each pass: as_pytorch.py may have made it torch since
        n = len(self.dataset)
        order = self._rng.permutation(n) if self.shuffle else np.arange(n)
        for b in range(len(self)):
            items = [self.dataset[int(i)] for i in order[b * self.batch_size:
                                                         (b + 1) * self.batch_size]]
            images = np.stack([np.asarray(x, np.float32) for x, _ in items])
            labels = np.asarray([y for _, y in items], np.int64)
            yield lockstep.from_numpy(images), lockstep.from_numpy(labels)


def save(state_dict, f):
    """torch.save's stand-in for a state dict: NumPy's .npz format (to the name given)."""
    with open(f, "wb") as out:
        np.savez(out, **{k: np.asarray(v.detach().numpy()) for k, v in state_dict.items()})


def save_image(tensor, fp, nrow=8, padding=2, normalize=False, **kwargs):
    """torchvision.utils.save_image's stand-in: writes the values as a .npy file beside fp."""
    path = os.path.splitext(str(fp))[0] + ".npy"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    np.save(path, np.asarray(tensor.detach().numpy()))
