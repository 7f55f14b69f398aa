"""Byte-level text data: fixed positional splits, the x/y shift, exact shards, and data_dir reading."""

from __future__ import annotations

import pytest
import torch

from esper_ray.data.sharding import shard_indices
from esper_ray.data.text import SPLITS, embedded_corpus, load_text

SEQ_LEN = 64


@pytest.fixture(scope="module")
def corpus() -> bytes:
    return embedded_corpus()


@pytest.fixture(scope="module")
def data():
    return load_text(None, SEQ_LEN)


def split_bytes(corpus: bytes) -> dict[str, bytes]:
    """The documented rule, recomputed: [0, 8n//10), [8n//10, 9n//10), [9n//10, n)."""
    n = len(corpus)
    return {"train": corpus[: 8 * n // 10], "val": corpus[8 * n // 10 : 9 * n // 10], "test": corpus[9 * n // 10 :]}


def tensors(data, split):
    return getattr(data, f"{split}_x"), getattr(data, f"{split}_y")


def test_embedded_corpus_is_the_sorted_pydoc_topics():
    from pydoc_data.topics import topics

    text = embedded_corpus()
    assert text.startswith(topics[sorted(topics)[0]].encode("utf-8"))
    assert len(text) == sum(len(v.encode("utf-8")) for v in topics.values()) + 2 * (len(topics) - 1)
    assert len(text) > 400_000


def test_splits_are_fixed_disjoint_and_in_position_order(data, corpus):
    expected = split_bytes(corpus)
    assert data.split_bytes == tuple(len(expected[s]) for s in SPLITS)
    assert sum(data.split_bytes) == len(corpus)
    for split in SPLITS:
        x, y = tensors(data, split)
        assert x.dtype == y.dtype == torch.int64
        # Rebuilding the covered bytes from the sequences gives the split's own bytes, in order.
        covered = bytes(torch.cat([x[:1, 0], y.reshape(-1)]).tolist())
        assert covered == expected[split][: 1 + data.tokens(split)]
    again = load_text(None, SEQ_LEN)
    assert all(torch.equal(a, b) for a, b in zip(tensors(data, "train"), tensors(again, "train")))


def test_targets_are_inputs_shifted_by_one_and_chunks_are_continuous(data):
    for split in SPLITS:
        x, y = tensors(data, split)
        assert x.shape == y.shape and x.shape[1] == SEQ_LEN
        assert torch.equal(y[:, :-1], x[:, 1:])  # y[i, t] == x[i, t + 1]
        assert torch.equal(x[1:, 0], y[:-1, -1])  # chunk i + 1 starts with chunk i's last target


def test_sequence_and_dropped_counts_follow_the_stride_rule(data):
    for split, n_bytes in zip(SPLITS, data.split_bytes):
        x, _ = tensors(data, split)
        assert len(x) == (n_bytes - 1) // SEQ_LEN
        assert data.tokens(split) == len(x) * SEQ_LEN
        assert 0 <= data.dropped_tokens(split) < SEQ_LEN
        assert data.tokens(split) + data.dropped_tokens(split) + 1 == n_bytes
    with pytest.raises(ValueError, match="split='validation'"):
        data.tokens("validation")


@pytest.mark.parametrize("num_shards", [1, 3, 8])
def test_training_shards_predict_every_target_token_exactly_once(data, corpus, num_shards):
    train = split_bytes(corpus)["train"]
    n = len(data.train_y)
    seen = torch.zeros(len(train), dtype=torch.int64)  # how often each byte of the split is a target
    total = 0
    for k in range(num_shards):
        idx = shard_indices(n, k, num_shards)
        ys = data.train_y[idx]
        for i, row in zip(idx.tolist(), ys):
            positions = torch.arange(i * SEQ_LEN + 1, (i + 1) * SEQ_LEN + 1)
            assert bytes(row.tolist()) == train[positions[0] : positions[-1] + 1]
            seen[positions] += 1
        total += ys.numel()
    assert total == data.tokens("train") == len(train) - 1 - data.dropped_tokens("train")
    assert seen[0] == 0 and torch.all(seen[1 : 1 + total] == 1) and torch.all(seen[1 + total :] == 0)


def test_max_bytes_keeps_a_prefix_and_splits_it_by_position(corpus):
    small = load_text(None, 8, max_bytes=1_000)
    assert small.split_bytes == (800, 100, 100)
    assert bytes(small.val_x[0].tolist()) == corpus[800:808]
    assert small.dropped_tokens("train") == 799 - 8 * 99


def test_data_dir_reads_every_txt_file_in_sorted_order(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"second file " * 10)
    (tmp_path / "a.txt").write_bytes(b"first file " * 10)
    (tmp_path / "notes.md").write_bytes(b"ignored")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_bytes(b"ignored too")
    expected = b"first file " * 10 + b"\n\n" + b"second file " * 10
    data = load_text(str(tmp_path), 4)
    n = len(expected)
    assert sum(data.split_bytes) == n and data.source == str(tmp_path)
    assert (
        bytes(torch.cat([data.train_x[:1, 0], data.train_y.reshape(-1)]).tolist())
        == expected[: 1 + data.tokens("train")]
    )
    assert bytes(data.test_x[0].tolist()) == expected[9 * n // 10 : 9 * n // 10 + 4]
    capped = load_text(str(tmp_path), 4, max_bytes=120)
    assert sum(capped.split_bytes) == 120
    last = (len(capped.train_x) - 1) * 4  # the last training chunk starts at byte (N - 1) * seq_len
    assert bytes(capped.train_x[-1].tolist() + capped.train_y[-1, -1:].tolist()) == expected[last : last + 5]
    # The test split is bytes [108, 120): it spans the separator and ends at the cap, inside b.txt.
    assert bytes(capped.test_x.reshape(-1).tolist() + capped.test_y[-1, -1:].tolist()) == expected[108:117]


def test_data_dir_errors_name_the_folder_and_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_text(str(tmp_path / "missing"), 4)
    (tmp_path / "readme.md").write_text("no text files here")
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}.*no \\*.txt file"):
        load_text(str(tmp_path), 4)
    (tmp_path / "a.txt").write_text("some text " * 20)
    (tmp_path / "b.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="'b.txt'.*is empty"):
        load_text(str(tmp_path), 4)
    (tmp_path / "b.txt").unlink()
    (tmp_path / "b.txt").symlink_to(tmp_path / "missing-target")  # listed, but cannot be opened
    with pytest.raises(ValueError, match="'b.txt'.*unreadable"):
        load_text(str(tmp_path), 4)


def test_load_text_rejects_bad_arguments_by_name(tmp_path):
    with pytest.raises(ValueError, match="seq_len=0"):
        load_text(None, 0)
    with pytest.raises(ValueError, match="max_bytes=0"):
        load_text(None, 8, max_bytes=0)
    with pytest.raises(ValueError, match="data_dir=3"):
        load_text(3, 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the val split has 10 bytes.*seq_len"):
        load_text(None, 16, max_bytes=100)
