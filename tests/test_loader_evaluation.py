"""EvalLoader: every sample of the held-out datasets exactly once per pass over
all ranks, in the plan's evaluation order, padding rows marked (labels -100,
mask False), and a second pass reads the same rows."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from fixtures_corpus import write_small_dataset
from loader_reference import DirectReader
from zephon_stream.errors import ConfigError
from zephon_stream.loader.front.evaluation import IGNORE_INDEX, EvalLoader

SEQ_LEN = 512


@pytest.mark.parametrize("world_size", [1, 3])
def test_each_sample_is_read_once_per_pass_and_padding_is_masked(small_dataset, small_bpe_dataset, world_size):
    urls = [small_dataset.url, small_bpe_dataset.url]
    reader = DirectReader(urls)
    loaders = [
        EvalLoader(urls, seq_len=SEQ_LEN, local_batch_size=5, rank=r, world_size=world_size) for r in range(world_size)
    ]
    try:
        order, total = loaders[0].order, loaders[0].num_samples
        assert total % (5 * world_size), "the fixture should leave a padded last step"
        seen = []
        for rank, loader in enumerate(loaders):
            batches = list(loader)
            assert len(batches) == loader.num_steps == -(-total // (5 * world_size))
            for step, batch in enumerate(batches):
                piece = order.rank_slice(step, 5 * world_size, world_size, rank)
                np.testing.assert_array_equal(batch["sample_positions"].numpy(), piece.indices)
                np.testing.assert_array_equal(batch["mask"].numpy(), piece.valid)
                for row in range(5):
                    tokens = reader.sample(
                        int(piece.stream[row]), int(piece.block[row]), int(piece.sample[row]), SEQ_LEN
                    )
                    np.testing.assert_array_equal(batch["input"][row].numpy(), tokens[:-1])
                    if piece.valid[row]:
                        np.testing.assert_array_equal(batch["labels"][row].numpy(), tokens[1:])
                    else:
                        assert (batch["labels"][row] == IGNORE_INDEX).all()
                seen += batch["sample_positions"][batch["mask"]].tolist()
            again = list(loader)
            assert all(torch.equal(a["input"], b["input"]) for a, b in zip(batches, again))
        assert sorted(seen) == list(range(total))
    finally:
        for loader in loaders:
            loader.close()
        reader.close()


def test_bad_sizes_are_refused(small_dataset):
    with pytest.raises(ConfigError, match="local_batch_size"):
        EvalLoader(small_dataset.url, seq_len=SEQ_LEN, local_batch_size=0)


def test_a_rebuild_reuses_the_parsed_manifest_unless_the_dataset_was_written_again(stdlib_corpus, tmp_path):
    url = str(tmp_path / "heldout")
    first = write_small_dataset(stdlib_corpus, tmp_path / "heldout", "bytes", num_files=10)
    with (
        EvalLoader(url, seq_len=SEQ_LEN, local_batch_size=2) as one,
        EvalLoader(url, seq_len=SEQ_LEN, local_batch_size=2) as two,
    ):
        # What a validator's rebuild reads again is parsed and validated once.
        assert one.manifests[0][1].parsed is two.manifests[0][1].parsed
        assert one.manifests[0][1].fingerprint == first.manifest.fingerprint
    shutil.rmtree(tmp_path / "heldout")  # The same place, written again with more files
    second = write_small_dataset(stdlib_corpus, tmp_path / "heldout", "bytes", num_files=12)
    with EvalLoader(url, seq_len=SEQ_LEN, local_batch_size=2) as three:
        assert three.manifests[0][1].fingerprint == second.manifest.fingerprint != first.manifest.fingerprint
        assert three.num_samples > one.num_samples
