"""Byte-level language-modelling data: the embedded pydoc corpus or every *.txt file of a folder.

Tokens are bytes (vocab 256), so any text (any encoding) works and no tokenizer is needed.

Corpus. Without `data_dir`: Python's own help texts, `pydoc_data.topics.topics` (79 entries in Python 3.11),
joined in sorted key order with b"\\n\\n" and UTF-8 encoded: 466,273 bytes in Python 3.11.7, no download.
The text ships with the interpreter, so it differs between Python versions (and so do the splits'
contents); `TextData.source` names the version. With `data_dir`: every `*.txt` file directly in that folder
(not its sub-folders), in sorted name order, joined with b"\\n\\n" (TinyStories' text files work as they are).
`max_bytes` keeps only the corpus's first `max_bytes` bytes (files after that point are not read).

Splits, fixed by position, never by seed (the same bytes for every run, env and A/B arm), for a corpus of
n bytes: train = bytes [0, 8n // 10), validation = [8n // 10, 9n // 10), test = [9n // 10, n).
As in datasets.py, the test split is read only by the final evaluation.

Sequences. A split of L bytes is cut into N = (L - 1) // seq_len chunks of seq_len + 1 bytes, chunk i
starting at byte i * seq_len (stride seq_len, so consecutive chunks share one byte): x = chunk[:-1],
y = chunk[1:]. Every byte of the split from byte 1 to byte N * seq_len is a target exactly once; byte 0
is only an input, and the last L - 1 - N * seq_len bytes (fewer than seq_len) are dropped
(`TextData.dropped_tokens`). Training sequences shard like images: `shard_indices(N, k, n)` gives
sequence k, k + n, ... (esper_ray/data/sharding.py).

Size. The embedded corpus (Python 3.11.7) at seq_len 64 gives 5,828 / 728 / 728 train / validation / test
sequences (372,992 / 46,592 / 46,592 target tokens; 25 / 34 / 35 tail bytes dropped). One training epoch of
the "text" host preset (esper_ray/morpho/transformer.py) at batch 64 with AdamW, measured: 6.5-7.3 s with 2
threads and 10-11 s with 1 thread on the 2-core development VM (shared with other jobs at the time);
5.1-5.7 s with 2 threads and 7.7-7.9 s with 1 thread on 2 pinned cores of a Xeon server (Python 3.12's
corpus: 6,246 sequences). So the whole corpus is used by default; `max_bytes` shortens an epoch in proportion.

Storage. All tensors are int64 (what nn.Embedding and cross_entropy take), contiguous [N, seq_len]:
about 16 bytes of memory per corpus byte (x and y), so cap a large corpus such as TinyStories (1.9 GB)
with `max_bytes`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from esper_ray.contracts.fields import check_int

VOCAB_SIZE = 256
SPLITS: tuple[str, ...] = ("train", "val", "test")
FILE_SEPARATOR = b"\n\n"


@dataclass(frozen=True)
class TextData:
    train_x: torch.Tensor
    """[N_train, seq_len] int64 input bytes."""
    train_y: torch.Tensor
    """[N_train, seq_len] int64 target bytes: train_y[i, t] is the byte after train_x[i, t]."""
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    """Held-out split: only the final evaluation reads it."""
    test_y: torch.Tensor
    seq_len: int
    """Tokens (bytes) per sequence."""
    split_bytes: tuple[int, int, int]
    """Bytes of the corpus in the train, val and test splits, before cutting into sequences."""
    source: str
    """Where the corpus came from (the pydoc topics of a Python version, or a folder)."""
    vocab_size: int = VOCAB_SIZE

    def _index(self, split: str) -> int:
        if split not in SPLITS:
            raise ValueError(f"split={split!r}: choose one of {', '.join(SPLITS)}")
        return SPLITS.index(split)

    def tokens(self, split: str) -> int:
        """Target tokens of a split: sequences * seq_len (every one is predicted once per epoch)."""
        y = (self.train_y, self.val_y, self.test_y)[self._index(split)]
        return y.numel()

    def dropped_tokens(self, split: str) -> int:
        """Bytes of a split that are never a target: the tail too short for a full chunk (< seq_len)."""
        return self.split_bytes[self._index(split)] - 1 - self.tokens(split)


def embedded_corpus() -> bytes:
    """The running Python's pydoc help texts, joined in sorted key order with b"\\n\\n" (UTF-8)."""
    from pydoc_data.topics import topics

    return FILE_SEPARATOR.join(topics[key].encode("utf-8") for key in sorted(topics))


def read_text_folder(data_dir: str, max_bytes: int | None = None) -> bytes:
    """Every *.txt file directly in `data_dir`, in sorted name order, joined with b"\\n\\n", cut at max_bytes.

    Raises FileNotFoundError when the folder is missing or holds no .txt file, and ValueError when a file
    is empty or unreadable, naming the folder. Files past `max_bytes` are checked for size but not read.
    """
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"text data_dir {str(folder)!r} is not a folder; put one or more *.txt files in it")
    files = sorted(p for p in folder.glob("*.txt") if not p.is_dir())  # a dangling link is unreadable, not skipped
    if not files:
        raise FileNotFoundError(f"text data_dir {str(folder)!r} holds no *.txt file (sub-folders are not searched)")
    parts: list[bytes] = []
    read = 0  # bytes of the joined corpus so far, separators included
    for i, path in enumerate(files):
        try:
            if path.stat().st_size == 0:
                raise ValueError(f"text file {path.name!r} in {str(folder)!r} is empty; remove it or add text")
            if max_bytes is not None and read >= max_bytes:
                continue  # past the prefix: checked, not read
            with path.open("rb") as f:
                text = f.read() if max_bytes is None else f.read(max_bytes - read)
        except OSError as err:
            raise ValueError(f"text file {path.name!r} in {str(folder)!r} is unreadable: {err}") from None
        parts.append((FILE_SEPARATOR if i > 0 else b"") + text)
        read += len(parts[-1])
    return b"".join(parts)[:max_bytes]


def _sequences(split: bytes, seq_len: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunks of seq_len + 1 bytes at stride seq_len -> (x, y), each [N, seq_len] int64."""
    n = (len(split) - 1) // seq_len
    if n < 1:
        raise ValueError(
            f"the {name} split has {len(split)} bytes, fewer than seq_len + 1 = {seq_len + 1}; "
            f"use a shorter seq_len, a larger max_bytes or more text"
        )
    data = torch.frombuffer(bytearray(split), dtype=torch.uint8).long()  # (L,)
    chunks = data[: n * seq_len + 1].unfold(0, seq_len + 1, seq_len)  # (N, seq_len + 1), a view
    return chunks[:, :-1].contiguous(), chunks[:, 1:].contiguous()


def load_text(data_dir: str | None, seq_len: int, max_bytes: int | None = None) -> TextData:
    """Load the corpus (embedded or from data_dir), split it by position and cut it into sequences.

    Args:
        data_dir: folder of *.txt files, or None for the embedded pydoc corpus.
        seq_len: tokens (bytes) per sequence; must not exceed the host's seq_len.
        max_bytes: keep only the corpus's first max_bytes bytes (None: all of it).
    """
    check_int("seq_len", seq_len, 1)
    if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1):
        raise ValueError(f"max_bytes={max_bytes!r}: must be None (the whole corpus) or an integer >= 1")
    if data_dir is not None and not isinstance(data_dir, (str, Path)):
        raise ValueError(f"data_dir={data_dir!r}: must be a folder path or None (the embedded corpus)")
    if data_dir is None:
        corpus = embedded_corpus()[:max_bytes]
        source = f"pydoc_data.topics of Python {sys.version.split()[0]}"
    else:
        corpus = read_text_folder(str(data_dir), max_bytes)
        source = str(Path(data_dir).expanduser())
    n = len(corpus)
    bounds = (0, 8 * n // 10, 9 * n // 10, n)
    splits = [corpus[bounds[i] : bounds[i + 1]] for i in range(3)]
    (train_x, train_y), (val_x, val_y), (test_x, test_y) = (
        _sequences(s, seq_len, name) for s, name in zip(splits, SPLITS)
    )
    return TextData(
        train_x,
        train_y,
        val_x,
        val_y,
        test_x,
        test_y,
        seq_len=seq_len,
        split_bytes=(len(splits[0]), len(splits[1]), len(splits[2])),
        source=source,
    )
