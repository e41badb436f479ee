"""``packing="best_fit"`` through the loader: rows of whole documents, with the order exact as under windows.

The dataset is real text cut into documents at top-level definitions
(``definitions_dataset``: 145 documents of 10 to ~6,000 BPE tokens in 26
blocks of 4,097 tokens). Each row is checked against the block's best-fit
rows computed straight from its tokens (``loader_reference.DirectReader``);
what the rows hold (whole documents but the counted cuts, every region
token once) is ``tests/test_plan_packing.py``'s to prove. Here: the loader
delivers those rows with their labels, positions and document outputs at any
world size, across resumes, mixtures, a ``seq_len`` change and evaluation,
and refuses a checkpoint of the other packing.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from loader_reference import DirectReader, reference_positions, run_step_hashes
from zephon_stream import Stream, StreamingLoader
from zephon_stream.errors import ConfigError, StateMismatchError
from zephon_stream.loader import EvalLoader, Phase
from zephon_stream.loader.planning.memory import PACKING_WORK_BYTES_PER_TOKEN
from zephon_stream.loader.ring.row_documents import IGNORE_INDEX

SEQ_LEN = 256  # 4097-token blocks hold 16 rows
GLOBAL_BATCH = 30  # Divided by world sizes 1, 2, 3 and 5


def loader_for(url, **kwargs):
    kwargs.setdefault("seq_len", SEQ_LEN)
    kwargs.setdefault("local_batch_size", 8)
    kwargs.setdefault("num_fetch_threads", 2)
    kwargs.setdefault("packing", "best_fit")
    return StreamingLoader(url, **kwargs)


def ranks(url, world_size, **kwargs):
    return [
        loader_for(url, local_batch_size=GLOBAL_BATCH // world_size, world_size=world_size, rank=r, **kwargs)
        for r in range(world_size)
    ]


def close_all(loaders):
    for loader in loaders:
        loader.close()


@pytest.fixture(scope="module")
def reader(definitions_dataset, small_dataset):
    out = DirectReader([definitions_dataset.url, small_dataset.url])
    yield out
    out.close()


def test_the_worked_case_of_the_packing_docs_reads_as_written(tmp_path):
    """docs/PACKING.md: documents [E] [E] [a,E] [b,c,d,E], ``--tokenizer bytes --block-tokens 7``,
    seq_len 2, 3 lanes: the last piece [b,c] is L long, so best fit places it (no edge piece)."""
    from packing_reference import check_outputs
    from zephon_stream.cli import main

    e, a, b, c, d = 256, 97, 98, 99, 100
    ids = tmp_path / "documents.jsonl"
    ids.write_text("".join(f'{{"input_ids": {doc}}}\n' for doc in ([e], [e], [a, e], [b, c, d, e])))
    url = str(tmp_path / "ds")
    assert (
        main(
            [
                "write",
                str(ids),
                "--input-format",
                "tokens",
                "--tokenizer",
                "bytes",
                "--block-tokens",
                "7",
                "--output",
                url,
                "--no-progress",
            ]
        )
        == 0
    )
    want = {
        "concat": ([[e, e], [a, e], [b, c]], [[e, a], [e, b], [c, d]]),
        "best_fit": ([[a, e], [b, c], [e, e]], [[e, b], [c, d], [e, a]]),
    }
    for packing, (inputs, labels) in want.items():
        options = {"seq_len": 2, "local_batch_size": 3, "lanes": 3, "packing": packing, "packing_outputs": True}
        with StreamingLoader(url, **options) as loader:
            batch = next(loader)
        assert batch["input"].tolist() == inputs, packing
        assert batch["labels"].tolist() == labels, packing
        check_outputs(batch, np.array(inputs), np.array(labels), np.full(3, e), ignore=False)


@pytest.mark.parametrize("pipeline", ["threads", "process"])
@pytest.mark.parametrize("targets", ["predict", "ignore"])
def test_every_row_is_its_blocks_best_fit_row_with_labels_positions_and_documents(
    definitions_dataset, reader, pipeline, targets
):
    eos = definitions_dataset.manifest.tokenizer.eos_id
    with loader_for(
        definitions_dataset.url, pipeline=pipeline, cross_document_targets=targets, packing_outputs=True
    ) as loader:
        for step, batch in zip(range(40), loader):
            piece = loader.order.rank_slice(step * 8, 8, 1, 0)
            inputs = batch["input"].numpy()
            for row in range(8):
                tokens = reader.sample(0, int(piece.block[row]), int(piece.sample[row]), SEQ_LEN, "best_fit")
                np.testing.assert_array_equal(inputs[row], tokens[:-1])
                labels = tokens[1:].copy()
                if targets == "ignore":
                    labels[tokens[:-1] == eos] = IGNORE_INDEX
                np.testing.assert_array_equal(batch["labels"][row].numpy(), labels)
            positions = reference_positions(inputs, eos)
            np.testing.assert_array_equal(batch["positions"].numpy(), positions)
            # A document (piece) starts where positions restart; the outputs say the same.
            starts = np.flatnonzero(positions.reshape(-1) == 0)
            np.testing.assert_array_equal(batch["cu_seqlens"][: int(batch["num_cu_seqlens"]) - 1].numpy(), starts)
        assert loader.stats()["pack_s"] > 0
        assert loader.state_dict()["packing"] == "best_fit"


def test_an_epoch_of_best_fit_rows_takes_every_input_token_of_the_windows_once(definitions_dataset):
    """Per block, the rows' inputs are the windows' inputs rearranged; every input
    that is not an EOS keeps its label (the next token of its document)."""
    eos = definitions_dataset.manifest.tokenizer.eos_id
    by_packing = {}
    for packing in ("concat", "best_fit"):
        with loader_for(definitions_dataset.url, packing=packing, local_batch_size=16, pipeline="threads") as loader:
            per_epoch = loader.progress()[0]["samples_read_per_epoch"]
            rows: dict[int, list[np.ndarray]] = {}
            for step, batch in zip(range(per_epoch // 16), loader):
                piece = loader.order.rank_slice(step * 16, 16, 1, 0)
                for row in range(16):
                    rows.setdefault(int(piece.block[row]), []).append(
                        np.stack([batch["input"][row].numpy(), batch["labels"][row].numpy()])
                    )
        by_packing[packing] = {block: np.concatenate(pairs, axis=1) for block, pairs in rows.items()}
    counts = definitions_dataset.manifest.block_token_counts()
    whole = [
        block
        for block, pairs in by_packing["concat"].items()
        if pairs.shape[1] == (counts[block] - 1) // SEQ_LEN * SEQ_LEN
    ]
    assert by_packing["concat"].keys() == by_packing["best_fit"].keys() and len(whole) >= len(counts) - 2
    for block in whole:
        windows = by_packing["concat"][block]
        packed = by_packing["best_fit"][block]
        assert Counter(windows[0].tolist()) == Counter(packed[0].tolist()), f"block {block}"
        keep_w, keep_p = windows[0] != eos, packed[0] != eos
        assert Counter(map(tuple, windows[:, keep_w].T.tolist())) == Counter(map(tuple, packed[:, keep_p].T.tolist()))


def test_any_world_size_reads_the_single_rank_run_and_resumes_mid_block_at_another(definitions_dataset):
    with loader_for(definitions_dataset.url, local_batch_size=GLOBAL_BATCH, seed=3) as single:
        expected = run_step_hashes([single], 24)
    with loader_for(definitions_dataset.url, local_batch_size=GLOBAL_BATCH, seed=3, packing="concat") as windows:
        assert run_step_hashes([windows], 24) != expected
    for world in (2, 3, 5):
        loaders = ranks(definitions_dataset.url, world, seed=3, pipeline="threads")
        try:
            assert run_step_hashes(loaders, 24) == expected, f"world size {world}"
        finally:
            close_all(loaders)
    # 30 samples a step over 16-sample blocks: step 7 starts inside a block.
    first = ranks(definitions_dataset.url, 2, seed=3, pipeline="threads")
    try:
        run_step_hashes(first, 7)
        state = first[0].state_dict()
    finally:
        close_all(first)
    assert state["packing"] == "best_fit" and state["position"] % 16
    for world in (3, 5):
        resumed = ranks(definitions_dataset.url, world, seed=3)
        try:
            for loader in resumed:
                loader.load_state_dict(state)
            assert run_step_hashes(resumed, 17) == expected[7:], f"resumed at world size {world}"
        finally:
            close_all(resumed)


def test_a_mixture_packs_each_stream_with_its_own_eos(definitions_dataset, small_dataset, reader):
    urls = [definitions_dataset.url, small_dataset.url]
    assert reader.manifests[0].tokenizer.eos_id != reader.manifests[1].tokenizer.eos_id
    with loader_for([Stream(urls[0], weight=3), Stream(urls[1], weight=1)], pipeline="threads") as loader:
        for step, batch in zip(range(20), loader):
            piece = loader.order.rank_slice(step * 8, 8, 1, 0)
            assert set(piece.stream.tolist()) == {0, 1}
            for row in range(8):
                tokens = reader.sample(
                    int(piece.stream[row]), int(piece.block[row]), int(piece.sample[row]), SEQ_LEN, "best_fit"
                )
                np.testing.assert_array_equal(batch["input"][row].numpy(), tokens[:-1])


def test_a_schedule_that_changes_seq_len_packs_each_phase_at_its_own_and_resumes_exactly(definitions_dataset, reader):
    schedule = [Phase(start_step=0, global_batch=12, seq_len=128), Phase(start_step=5, global_batch=6, seq_len=512)]
    with StreamingLoader(
        definitions_dataset.url, schedule=schedule, packing="best_fit", pipeline="threads", num_fetch_threads=2
    ) as loader:
        order = loader.schedule
        expected = []
        for step in range(12):
            batch = next(loader)
            piece = order.rank_slice(step, 1, 0)
            for row in range(order.phase_at_step(step).global_batch):
                tokens = reader.sample(0, int(piece.block[row]), int(piece.sample[row]), piece.seq_len, "best_fit")
                np.testing.assert_array_equal(batch["input"][row].numpy(), tokens[:-1])
            expected.append(batch["input"].numpy().copy())
    with StreamingLoader(
        definitions_dataset.url, schedule=schedule, packing="best_fit", pipeline="threads", num_fetch_threads=2
    ) as first:
        for _ in range(7):
            next(first)
        state = first.state_dict()
    assert state["version"] == 2 and state["packing"] == "best_fit"
    with StreamingLoader(definitions_dataset.url, schedule=schedule, pipeline="threads") as windows:
        with pytest.raises(StateMismatchError, match="packing .*checkpoint has 'best_fit', this loader has 'concat'"):
            windows.load_state_dict(state)
    resumed = [
        StreamingLoader(
            definitions_dataset.url, schedule=schedule, packing="best_fit", world_size=3, rank=r, num_fetch_threads=2
        )
        for r in range(3)
    ]
    try:
        for loader in resumed:
            loader.load_state_dict(state)
        for step in range(7, 12):
            np.testing.assert_array_equal(
                np.concatenate([next(loader)["input"].numpy() for loader in resumed]), expected[step]
            )
    finally:
        close_all(resumed)


def test_evaluation_reads_best_fit_rows_once(definitions_dataset, reader):
    with EvalLoader(definitions_dataset.url, seq_len=SEQ_LEN, local_batch_size=8, packing="best_fit") as evaluation:
        order = evaluation.order
        seen = 0
        for batch in evaluation:
            for row, position in enumerate(batch["sample_positions"].tolist()):
                if not batch["mask"][row]:
                    continue
                stream, block, sample = (int(a[0]) for a in order.sample_at(np.array([position])))
                tokens = reader.sample(stream, block, sample, SEQ_LEN, "best_fit")
                np.testing.assert_array_equal(batch["input"][row].numpy(), tokens[:-1])
                seen += 1
    assert seen == order.num_samples


def test_a_checkpoint_of_the_other_packing_is_refused_naming_both(definitions_dataset):
    with loader_for(definitions_dataset.url, packing="concat", pipeline="threads") as windows:
        next(windows)
        state = windows.state_dict()
    with loader_for(definitions_dataset.url, pipeline="threads") as best_fit:
        with pytest.raises(
            StateMismatchError,
            match=r"packing \(how rows are filled\): checkpoint has 'concat', "
            r"this loader has 'best_fit'",
        ):
            best_fit.load_state_dict(state)
        # A state saved before the packing was recorded is concat's.
        older = {key: value for key, value in state.items() if key != "packing"}
        with pytest.raises(StateMismatchError, match="checkpoint has 'concat'"):
            best_fit.load_state_dict(older)
    with loader_for(definitions_dataset.url, packing="concat", pipeline="threads") as windows:
        windows.load_state_dict(older)
        assert windows.state_dict()["position"] == 8
    with pytest.raises(ConfigError, match="packing must be one of 'concat', 'best_fit' \\(got 'first_fit'\\)"):
        loader_for(definitions_dataset.url, packing="first_fit")


def test_the_memory_bound_counts_the_packed_blocks_and_the_blocks_being_packed(definitions_dataset):
    with loader_for(definitions_dataset.url, packing="concat", pipeline="threads") as windows:
        plain = windows.memory_bound
    with loader_for(definitions_dataset.url, pipeline="threads") as packed:
        bound = packed.memory_bound
        for _ in zip(range(20), packed):
            pass
        stats = packed.stats()
    assert plain.packing_bytes == 0 and bound.packing_bytes > 0
    assert bound.block_bytes == 16 * (SEQ_LEN + 1) * 2 and plain.block_bytes == 4097 * 2
    assert "for the blocks being packed" in bound.describe()
    assert bound.packing_bytes == 2 * 4097 * (2 + PACKING_WORK_BYTES_PER_TOKEN)  # One block per decode thread
    assert stats["cache_peak_bytes"] <= stats["cache_capacity_bytes"]
