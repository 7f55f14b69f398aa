"""Data: exact shards (seed doc 000), fixed splits, CIFAR-10 on-disk format, synthetic data, augmentation."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from esper_ray.contracts.env_config import EnvConfig
from esper_ray.data.augment import crop_and_flip
from esper_ray.data.datasets import load_cifar10, load_digits, make_synthetic
from esper_ray.data.sharding import DeviceShard, shard_indices
from esper_ray.env import MorphogeneticEnv
from esper_ray.env.epoch import Precision, train_epoch
from tests.morpho_helpers import make_model


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 500), shards=st.integers(1, 12))
def test_shards_are_disjoint_and_cover_the_training_set(n, shards):
    if shards > n:
        with pytest.raises(ValueError, match="exceeds"):
            shard_indices(n, 0, shards)
        return
    parts = [shard_indices(n, k, shards).tolist() for k in range(shards)]
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(n)) and len(set(flat)) == n
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_seed_doc_000_ten_samples_three_shards_batch_two_keeps_every_sample():
    """Seed doc 000: 10 samples, 3 envs, batch 2. No tail is dropped; counts and means use what was processed."""
    torch.manual_seed(0)
    x = torch.randn(10, 1, 8, 8)
    y = torch.arange(10) % 10
    model = make_model(["r0c0"])
    total_samples, total_batches = 0, 0
    for k in range(3):
        idx = shard_indices(10, k, 3)
        shard = DeviceShard(x[idx], y[idx], torch.device("cpu"))
        order = torch.randperm(len(idx), generator=torch.Generator().manual_seed(k))  # the epoch's order, drawn here
        delivered = [(x[idx][order[i : i + 2]], y[idx][order[i : i + 2]]) for i in range(0, len(idx), 2)]
        # A frozen model (lr 0): the epoch's mean must be the per-sample mean over the batches delivered,
        # not a mean of batch means or a division by a nominal batch count.
        frozen = torch.optim.SGD(model.host.parameters(), lr=0.0)
        model.train()
        with torch.no_grad():
            per_sample = torch.cat(
                [torch.nn.functional.cross_entropy(model(xb), yb, reduction="none") for xb, yb in delivered]
            )
        stats = train_epoch(
            model,
            frozen,
            shard,
            batch_size=2,
            generator=torch.Generator().manual_seed(k),
            prepare=lambda t: t,
            precision=Precision(),
            max_grad_norm=1.0,
        )
        assert stats.batches == len(delivered) == -(-len(idx) // 2)
        assert stats.samples == len(idx) == sum(len(b[1]) for b in delivered)
        assert stats.loss == pytest.approx(float(per_sample.mean()), rel=1e-5)
        total_samples += stats.samples
        total_batches += stats.batches
    assert total_samples == 10 and total_batches == 2 + 2 + 2  # shard sizes 4, 3, 3 -> 2 + 2 + 2 batches


def test_digits_train_validation_and_test_splits_are_fixed_disjoint_and_real():
    a, b = load_digits(), load_digits()
    assert torch.equal(a.val_x, b.val_x) and torch.equal(a.test_x, b.test_x) and torch.equal(a.train_y, b.train_y)
    assert (len(a.train_y), len(a.val_y), len(a.test_y)) == (1079, 359, 359)
    train_rows = {tuple(r) for r in a.train_x.flatten(1).tolist()}
    val_rows = {tuple(r) for r in a.val_x.flatten(1).tolist()}
    for held_out in (a.val_x, a.test_x):
        overlap = sum(tuple(r) in train_rows for r in held_out.flatten(1).tolist())
        assert overlap < 10  # the digits set has a handful of exact duplicate images, nothing more
    assert sum(tuple(r) in val_rows for r in a.test_x.flatten(1).tolist()) < 10
    prepared = a.prepare(a.train_x[:100])
    assert prepared.dtype == torch.float32 and abs(float(prepared.mean())) < 0.5


def _write_cifar(root, n_per_batch: int = 6, byte_keys: bool = True):
    """CIFAR-10 batches as pickles: byte-string keys as the original Python 2 files have, or str keys as Python 3
    writes them (both are read as torchvision reads them)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(n_per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, n_per_batch)]
        batch = {b"data": data, b"labels": labels} if byte_keys else {"data": data, "labels": labels}
        with (folder / name).open("wb") as f:
            pickle.dump(batch, f)
    return folder


@pytest.mark.parametrize("byte_keys", [True, False])
def test_cifar10_loads_torchvision_format_with_a_validation_split_carved_from_training(tmp_path, byte_keys):
    folder = _write_cifar(tmp_path, n_per_batch=20, byte_keys=byte_keys)
    data = load_cifar10(str(tmp_path))
    # 100 training images: 10 become the validation split; test_batch is the test split
    assert (
        data.train_x.shape == (90, 3, 32, 32)
        and data.val_x.shape == (10, 3, 32, 32)
        and data.test_x.shape == (20, 3, 32, 32)
    )
    with (folder / "test_batch").open("rb") as f:
        test = pickle.load(f, encoding="bytes" if byte_keys else "ASCII")
    # channel planes are R, G, B of 1024 pixels each, row-major
    assert data.test_x[0, 1, 0, 5] == test[b"data" if byte_keys else "data"][0][1024 + 5]
    train_rows = {tuple(r) for r in data.train_x.flatten(1).tolist()}
    assert not any(tuple(r) in train_rows for r in data.val_x.flatten(1).tolist())


def test_cifar10_with_garbage_files_says_which_folder_is_unreadable(tmp_path):
    folder = _write_cifar(tmp_path)
    (folder / "data_batch_3").write_bytes(b"not a pickle at all")
    with pytest.raises(ValueError, match=r"CIFAR-10 in .*cifar-10-batches-py is unreadable"):
        load_cifar10(str(tmp_path))


def test_cifar10_missing_says_where_it_looked_and_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"looked in .*cifar-10-batches-py.*cifar-10-python.tar.gz"):
        load_cifar10(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="needs data_dir"):
        load_cifar10(None)


def test_synthetic_data_is_learnable_by_nearest_class_mean():
    data = make_synthetic(2000)
    assert data.train_x.dtype == torch.uint8  # stored as CIFAR is
    means = torch.stack([data.prepare(data.train_x[data.train_y == c]).mean(0) for c in range(10)])
    for x, y in ((data.val_x, data.val_y), (data.test_x, data.test_y)):
        distances = ((data.prepare(x)[:, None] - means[None]) ** 2).flatten(2).sum(-1)
        accuracy = float((distances.argmin(1) == y).float().mean())
        assert accuracy > 0.5 and len(y) == 400
    assert data.train_x.shape[1:] == (3, 32, 32) and not torch.equal(data.val_x, data.test_x)


def test_synthetic_held_out_size_does_not_follow_the_training_size():
    # a benchmark comparing 4 and 8 envs at equal work per env needs the same validation set for both
    small, large = make_synthetic(1000, held_out=300), make_synthetic(4000, held_out=300)
    assert len(small.train_y) == 1000 and len(large.train_y) == 4000
    assert len(small.val_y) == len(large.val_y) == len(small.test_y) == len(large.test_y) == 300
    env = MorphogeneticEnv(
        {
            "task": "synthetic",
            "synthetic_size": 1000,
            "synthetic_held_out": 300,
            "num_shards": 2,
            "slots": ["r0c1"],
            "max_epochs": 2,
            "device": "cpu",
        }
    )
    assert len(env.shard) == 500 and len(env.val_y) == 300  # the training set is sharded, validation is not
    with pytest.raises(ValueError, match="synthetic_held_out=3: must be an integer >= 10"):
        EnvConfig(task="synthetic", synthetic_held_out=3)


def test_crop_and_flip_moves_content_within_the_padding():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).view(2, 3, 8, 8) + 1
    out = crop_and_flip(x, torch.Generator().manual_seed(1), padding=2)
    assert out.shape == x.shape
    for i in range(2):
        values = set(out[i].flatten().tolist()) - {0.0}
        assert values <= set(x[i].flatten().tolist()) and len(values) >= 3 * 6 * 6
