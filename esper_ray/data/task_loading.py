"""A registered task's data (contracts/registry.py): the loader's TaskData as it is, or its splits (arrays or torch
Datasets) turned into TaskData.

A plug-in's loader returns a mapping of three splits, each a pair (x, y) of numpy arrays or tensors, or a torch
Dataset of (x, y) items:
    {"train": (x, y), "validation": (x, y), "test": (x, y)}      optionally also "num_classes": int
x is [N, ...] (the host's input, float features or token ids); y is [N] class labels (loss classification) or
[N, T] the next tokens (loss tokens). The test split is read only by a final evaluation, never by a reward.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from esper_ray.contracts import registry
from esper_ray.data.datasets import TaskContext, TaskData

SPLITS = ("train", "validation", "test")


def load_task(name: str, context: TaskContext) -> TaskData:
    """The data of task `name`, checked against the loss kind it was registered with."""
    entry = registry.task(name)
    raw = registry.resolve(entry.entry_point)(context)
    tokens = entry.loss == "tokens"
    data = raw if isinstance(raw, TaskData) else task_data_from(name, raw, tokens=tokens)
    if data.tokens != tokens:
        raise ValueError(
            f"task {name!r}: registered with loss={entry.loss!r}, but its loader returned "
            f"{'token' if data.tokens else 'labelled'} data"
        )
    return data


def task_data_from(name: str, splits: Any, *, tokens: bool = False) -> TaskData:
    """TaskData from a mapping of the three splits (see the module docstring); ValueError in one line otherwise."""
    if not isinstance(splits, Mapping) or any(s not in splits for s in SPLITS):
        raise ValueError(
            f"task {name!r}: its loader returned {type(splits).__name__}; expected TaskData or a mapping "
            f"with the splits {list(SPLITS)} (each (x, y) arrays or a torch Dataset)"
        )
    unknown = sorted(set(splits) - {*SPLITS, "num_classes"})
    if unknown:
        raise ValueError(f"task {name!r}: unknown keys {unknown}; expected {[*SPLITS, 'num_classes']}")
    parts = {s: _split(name, s, splits[s], tokens) for s in SPLITS}
    shapes = {tuple(x.shape[1:]) for x, _ in parts.values()}
    if len(shapes) != 1:
        raise ValueError(f"task {name!r}: the splits' inputs differ in shape ({sorted(shapes)}); they must agree")
    largest = max(int(y.max()) for _, y in parts.values())
    num_classes = splits.get("num_classes", largest + 1)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes <= largest:
        raise ValueError(
            f"task {name!r}: num_classes={num_classes!r}; must be an integer above the largest label {largest}"
        )
    (train_x, train_y), (val_x, val_y), (test_x, test_y) = (parts[s] for s in SPLITS)
    return TaskData(name, train_x, train_y, val_x, val_y, test_x, test_y, num_classes, 1.0, (), (), tokens=tokens)


def _split(name: str, split: str, raw: Any, tokens: bool) -> tuple[torch.Tensor, torch.Tensor]:
    where = f"task {name!r}, split {split!r}"
    if isinstance(raw, Dataset):
        items = [raw[i] for i in range(len(raw))]  # type: ignore[arg-type]
        if not items:
            raise ValueError(f"{where}: the Dataset is empty")
        raw = (
            torch.stack([torch.as_tensor(np.asarray(x)) for x, _ in items]),
            torch.as_tensor(np.asarray([np.asarray(y) for _, y in items])),
        )
    if not isinstance(raw, (tuple, list)) or len(raw) != 2:
        raise ValueError(f"{where}: got {type(raw).__name__}; expected a pair (x, y) of arrays or a torch Dataset")
    x, y = (torch.as_tensor(np.asarray(v)) if not isinstance(v, torch.Tensor) else v for v in raw)
    if len(x) == 0 or len(x) != len(y):
        raise ValueError(f"{where}: x has {len(x)} rows and y {len(y)}; they must be equal and non-zero")
    if y.is_floating_point() or y.is_complex():
        raise ValueError(f"{where}: y is {y.dtype}; labels are integers (class indices or token ids)")
    expected = 2 if tokens else 1
    if y.dim() != expected or (tokens and tuple(y.shape) != tuple(x.shape)):
        kind = "[N, T] next tokens, the shape of x" if tokens else "[N] class labels"
        raise ValueError(
            f"{where}: y has shape {tuple(y.shape)}; loss {'tokens' if tokens else 'classification'} takes {kind}"
        )
    if int(y.min()) < 0:
        raise ValueError(f"{where}: y holds {int(y.min())}; labels are >= 0")
    if x.is_floating_point():
        x = x.to(torch.float32)
    elif tokens:
        x = x.to(torch.int64)
    return x.contiguous(), y.to(torch.int64).contiguous()


def load_task_data(
    task: str,
    data_dir: str | None = None,
    synthetic_size: int = 10_000,
    seq_len: int = 64,
    max_bytes: int | None = None,
    synthetic_held_out: int | None = None,
) -> TaskData:
    """A registered task's data (contracts/registry.py) by name and settings."""
    context = TaskContext(data_dir, synthetic_size, seq_len, max_bytes, synthetic_held_out)
    return load_task(task, context)
