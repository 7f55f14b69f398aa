"""Task data: the embedded digits, CIFAR-10 from disk in torchvision's format, synthetic images, and text.

Images are kept compact (uint8 where the source is) and turned into normalised floats on the device, batch
by batch (`TaskData.prepare`). Every task has three fixed, disjoint splits that depend only on the task, never
on the run's seed, so every env and every A/B arm sees the same samples:
    train       the env's training data (sharded across envs)
    validation  what rewards, observations and the governor read every epoch
    test        held out: read only by the final evaluation of an A/B trial (`esper-ray eval`, `ab`), never
                by a reward or an observation, so the controller is never trained on it
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esper_ray.data.text import load_text

SPLIT_SEED = 20_251_227
DIGITS_VAL_FRACTION = 0.2
DIGITS_TEST_FRACTION = 0.2
CIFAR_VAL_SIZE = 5_000  # carved from the 50,000 training images; test_batch is the test split
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
CIFAR_HELP = (
    "Download https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz and extract it there "
    "(`tar xzf cifar-10-python.tar.gz -C DIR`), or run "
    "`python -c \"import torchvision; torchvision.datasets.CIFAR10('DIR', download=True)\"`."
)


@dataclass(frozen=True)
class TaskContext:
    """The run's data settings a task's loader may read (EnvConfig's fields of these names); a plug-in may ignore
    them."""

    data_dir: str | None = None
    synthetic_size: int = 10_000
    seq_len: int = 64
    """The host's context length (token tasks)."""
    text_max_bytes: int | None = None
    synthetic_held_out: int | None = None


@dataclass(frozen=True)
class TaskData:
    name: str
    train_x: torch.Tensor
    """[N, ...] raw inputs: images [N, C, H, W] (uint8 or float32), token ids [N, T], or a plug-in's features."""
    train_y: torch.Tensor
    """[N] int64 labels."""
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    """Held-out split: only the final evaluation reads it."""
    test_y: torch.Tensor
    num_classes: int
    scale: float
    """Divide raw values by this to get [0, 1] (16 for digits, 255 for CIFAR and synthetic; unused for tokens)."""
    mean: tuple[float, ...]
    """Per image channel, subtracted after scaling; empty: inputs are only scaled (a plug-in's own features)."""
    std: tuple[float, ...]
    tokens: bool = False
    """Token sequences (x [N, T] int64, y [N, T] the next tokens) rather than images with one label each."""

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """Raw batch -> model input on x's device: normalised float32 images, or the token ids as they are."""
        if self.tokens:
            return x
        if not self.mean:
            return x.float() / self.scale
        mean = torch.tensor(self.mean, device=x.device)[None, :, None, None]
        std = torch.tensor(self.std, device=x.device)[None, :, None, None]
        return (x.float() / self.scale - mean) / std


def load_digits() -> TaskData:
    """scikit-learn's bundled 8x8 handwritten digits: 1,797 real images, values 0..16."""
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    x = torch.from_numpy(bunch.images.astype(np.uint8))[:, None]  # [1797, 1, 8, 8]
    y = torch.from_numpy(bunch.target.astype(np.int64))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_val = int(round(DIGITS_VAL_FRACTION * len(y)))
    n_test = int(round(DIGITS_TEST_FRACTION * len(y)))
    val, test, train = order[:n_val], order[n_val : n_val + n_test], order[n_val + n_test :]
    return TaskData("digits", x[train], y[train], x[val], y[val], x[test], y[test], 10, 16.0, (0.3,), (0.38,))


def _read_cifar_batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One pickled batch, read as torchvision reads it (latin1 turns the original Python 2 files' keys into str);
    pickles written by Python 3 may hold str or bytes keys, and both are accepted."""
    with path.open("rb") as f:
        batch = pickle.load(f, encoding="latin1")
    if isinstance(batch, dict):
        batch = {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in batch.items()}
    if not isinstance(batch, dict) or "data" not in batch or "labels" not in batch:
        keys = sorted(map(str, batch)) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(f"{path}: not a CIFAR-10 batch (expected a dict with 'data' and 'labels', got {keys})")
    data = np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return torch.from_numpy(data.copy()), torch.tensor(batch["labels"], dtype=torch.int64)


def load_cifar10(data_dir: str | None) -> TaskData:
    """CIFAR-10 as torchvision stores it: DIR/cifar-10-batches-py/data_batch_{1..5} and test_batch."""
    if data_dir is None:
        raise FileNotFoundError(
            f"task cifar10 needs data_dir, a folder holding cifar-10-batches-py/: give --env "
            f"data_dir=DIR (heuristic also takes --data-dir DIR). {CIFAR_HELP}"
        )
    root = Path(data_dir).expanduser() / "cifar-10-batches-py"
    train_files = [root / f"data_batch_{i}" for i in range(1, 6)]
    missing = [p.name for p in [*train_files, root / "test_batch"] if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"CIFAR-10 not found: looked in {root} for {', '.join(missing)}. {CIFAR_HELP}")
    try:
        parts = [_read_cifar_batch(p) for p in train_files]
        test_x, test_y = _read_cifar_batch(root / "test_batch")
    except (pickle.UnpicklingError, EOFError, ValueError) as err:
        raise ValueError(f"CIFAR-10 in {root} is unreadable ({err}). {CIFAR_HELP}") from None
    all_x = torch.cat([x for x, _ in parts])
    all_y = torch.cat([y for _, y in parts])
    order = torch.randperm(len(all_y), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_val = min(CIFAR_VAL_SIZE, len(all_y) // 10)  # a tenth of a (test-sized) small copy, 5,000 of the real one
    val, train = order[:n_val], order[n_val:]
    return TaskData(
        "cifar10", all_x[train], all_y[train], all_x[val], all_y[val], test_x, test_y, 10, 255.0, CIFAR_MEAN, CIFAR_STD
    )


def make_synthetic(
    train_size: int,
    image_size: int = 32,
    channels: int = 3,
    num_classes: int = 10,
    held_out: int | None = None,
    seed: int = SPLIT_SEED,
    name: str = "synthetic",
) -> TaskData:
    """Learnable CIFAR-shaped data, stored as CIFAR is (uint8): each class is a smooth random prototype, samples add
    noise and a gain, quantised as 128 + 32 x, so `prepare` gives back x (about unit scale). Validation and test get
    `held_out` samples each (default: a fifth of train_size). `seed` fixes the prototypes and samples: another seed
    is another data set."""
    gen = torch.Generator().manual_seed(seed)
    coarse = torch.randn(num_classes, channels, 4, 4, generator=gen)
    prototypes = torch.nn.functional.interpolate(coarse, size=image_size, mode="bilinear", align_corners=False)
    held_out = max(train_size // 5 if held_out is None else held_out, num_classes)

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(num_classes, (n,), generator=gen)
        gain = 0.5 + torch.rand(n, 1, 1, 1, generator=gen)
        x = gain * prototypes[y] + 1.5 * torch.randn(n, channels, image_size, image_size, generator=gen)
        return (128 + 32 * x).round().clamp(0, 255).to(torch.uint8), y

    train_x, train_y = sample(train_size)
    val_x, val_y = sample(held_out)
    test_x, test_y = sample(held_out)
    mean, std = (128 / 255,) * channels, (32 / 255,) * channels
    return TaskData(name, train_x, train_y, val_x, val_y, test_x, test_y, num_classes, 255.0, mean, std)


def load_text_task(data_dir: str | None, seq_len: int, max_bytes: int | None) -> TaskData:
    """Byte-level text (data/text.py) as task data: 256 classes, one per byte, predicted at every position."""
    text = load_text(data_dir, seq_len, max_bytes)
    return TaskData(
        "text",
        text.train_x,
        text.train_y,
        text.val_x,
        text.val_y,
        text.test_x,
        text.test_y,
        text.vocab_size,
        1.0,
        (),
        (),
        tokens=True,
    )


def digits_task(context: TaskContext) -> TaskData:
    return load_digits()


def cifar10_task(context: TaskContext) -> TaskData:
    return load_cifar10(context.data_dir)


def synthetic_task(context: TaskContext) -> TaskData:
    return _synthetic_of(context)


def _synthetic_of(context: TaskContext, **shape: Any) -> TaskData:
    """make_synthetic at the run's sizes (synthetic_size, synthetic_held_out), of `shape` (image_size, channels,
    num_classes, seed, name): each seed other prototypes, so each variant below is a data set of its own."""
    return make_synthetic(context.synthetic_size, held_out=context.synthetic_held_out, **shape)


def synthetic_gray_task(context: TaskContext) -> TaskData:
    """digits-held-out's data set (contracts/families.py): 16x16 grey images of other prototypes than synthetic's."""
    return _synthetic_of(context, image_size=16, channels=1, seed=SPLIT_SEED + 1, name="synthetic-gray")


def patterns_task(context: TaskContext) -> TaskData:
    """grow-family's third data set (contracts/families.py): 12x12 images of 2 channels, 6 classes, prototypes of
    their own."""
    return _synthetic_of(context, image_size=12, channels=2, num_classes=6, seed=SPLIT_SEED + 2, name="patterns")


def textures_task(context: TaskContext) -> TaskData:
    """grow-held-out's data set, which no training member uses: 20x20 colour images, 8 classes, prototypes of their
    own."""
    return _synthetic_of(context, image_size=20, channels=3, num_classes=8, seed=SPLIT_SEED + 3, name="textures")


def text_task(context: TaskContext) -> TaskData:
    return load_text_task(context.data_dir, context.seq_len, context.text_max_bytes)
