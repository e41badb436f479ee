"""TorchFTLoader in one process: the pure step plan over any sequence of
quorums, and a real Manager (one replica group, real lighthouse) for the call
order, a failed commit and the config checks."""

from __future__ import annotations

import random
from datetime import timedelta

import numpy as np
import pytest
import torch

pytest.importorskip("torchft")

from zephon_stream.errors import ConfigError, StateMismatchError
from zephon_stream.integrations.torchft import (
    TorchFTConfig,
    TorchFTLoader,
    TorchFTOrderError,
)
from zephon_stream.integrations.torchft_plan import (
    IncompleteStepError,
    ReplicaDataState,
    advance,
    plan_step,
    trained_ranks,
)

GROUP_BATCH = 3


def share_positions(piece, group_batch: int) -> list[int]:
    # A share's positions as a set: the rank slicing permutes them
    # inside the step, but a piece is a contiguous run of the step's rows.
    first = piece.cursor + piece.index * group_batch
    return list(range(first, first + group_batch))


@pytest.mark.parametrize("seed", range(20))
def test_per_replica_plan_trains_each_position_once_whatever_the_quorums_and_heals(seed):
    rng = random.Random(seed)
    state = ReplicaDataState()
    trained: list[int] = []
    for _ in range(60):
        participants = rng.randint(1, 4)
        plan = plan_step(state, participants, group_batch=GROUP_BATCH, global_batch=None)
        counted = {k for k in range(participants) if rng.random() > 0.25}
        if rng.random() < 0.2:
            continue  # The step did not commit: the same state plans the next one
        for k in counted:
            trained += share_positions(plan.pieces[k], GROUP_BATCH)
        state = advance(state, plan, counted)
    owed = [p for piece in state.owed for p in share_positions(piece, GROUP_BATCH)]
    assert sorted(trained + owed) == list(range(state.cursor))


def test_per_replica_plan_serves_owed_shares_first_then_fresh_rows():
    state = ReplicaDataState()
    plan = plan_step(state, 3, group_batch=4, global_batch=None)
    state = advance(state, plan, {0})  # Ranks 1 and 2 were healing
    assert state.cursor == 12 and [p.index for p in state.owed] == [1, 2]
    plan = plan_step(state, 2, group_batch=4, global_batch=None)
    assert plan.pieces == state.owed and plan.fresh_rows == 0
    state = advance(state, plan, {0, 1})
    assert state.cursor == 12 and not state.owed


def test_fixed_global_refuses_a_committed_step_whose_rows_did_not_all_count():
    state = ReplicaDataState(policy="fixed_global")
    plan = plan_step(state, 3, group_batch=0, global_batch=10)
    assert advance(state, plan, {0, 1, 2}).cursor == 10
    with pytest.raises(IncompleteStepError, match=r"ranks \[1\] of 3 did not train.*use_async_quorum=False"):
        advance(state, plan, {0, 2})


def test_trained_ranks_refuses_a_rank_counted_twice():
    assert trained_ranks([1.0, 0.0, 1.0], 3, step=4) == {0, 2}
    with pytest.raises(StateMismatchError, match=r"step 4: participating ranks counted other than once.*\(1, 2.0\)"):
        trained_ranks([1.0, 2.0, 0.0], 3, step=4)


@pytest.fixture
def manager_factory():
    """Managers of one replica group each, each under its own lighthouse."""
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo
    from torchft.coordination import LighthouseServer

    made = []

    def make(*, async_quorum: bool = True):
        lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100, heartbeat_timeout_ms=1000)
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        manager = Manager(
            pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
            load_state_dict=lambda s: None,
            state_dict=dict,
            min_replica_size=1,
            use_async_quorum=async_quorum,
            timeout=timedelta(seconds=10),
            quorum_timeout=timedelta(seconds=20),
            rank=0,
            world_size=1,
            store_addr="127.0.0.1",
            store_port=store.port,
            lighthouse_addr=lighthouse.address(),
            replica_id="solo",
        )
        made.append((manager, store, lighthouse))
        return manager

    yield make
    for manager, _, lighthouse in made:
        manager.shutdown(wait=False)
        lighthouse.shutdown()


def make_loader(dataset, manager, packing="concat", **config):
    config = {"seq_len": 16, "group_batch_size": 4, "lanes": 8, **config}
    return TorchFTLoader(
        dataset.url,
        manager=manager,
        config=TorchFTConfig(**config),
        loader_options={"pipeline": "threads", "packing": packing},
    )


def test_next_before_the_quorum_or_twice_in_one_quorum_is_an_error_naming_the_fix(small_dataset, manager_factory):
    manager = manager_factory()
    with make_loader(small_dataset, manager) as loader:
        with pytest.raises(TorchFTOrderError, match=r"before the step's quorum: call optimizer.zero_grad\(\)"):
            next(loader)
        manager.start_quorum()
        next(loader)
        with pytest.raises(
            TorchFTOrderError, match=r"2 times in one quorum \(step 0, microbatches=1\).*manager.start_quorum\(\)"
        ):
            next(loader)


def test_a_step_that_does_not_commit_is_served_again_and_the_next_ones_follow(small_dataset, manager_factory):
    manager = manager_factory()
    served = []
    with make_loader(small_dataset, manager) as loader:
        for step in range(4):
            manager.start_quorum()
            served.append(sorted(next(loader)["sample_positions"].tolist()))
            if step == 1:
                manager.report_error(RuntimeError("injected"))
            manager.should_commit()
        assert loader.position == 12
    assert served == [[0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_state_of_another_order_is_refused_naming_the_field(small_dataset, manager_factory):
    manager = manager_factory()
    with make_loader(small_dataset, manager) as loader:
        state = loader.state_dict()
    other = manager_factory()
    with make_loader(small_dataset, other, seed=5) as loader:
        with pytest.raises(StateMismatchError, match=r"seed: state has 0, this loader has 5"):
            loader.load_state_dict(state)


def test_config_errors_name_the_fix(small_dataset, manager_factory):
    manager = manager_factory()
    with pytest.raises(ConfigError, match=r"fixed_global needs torchft's synchronous quorum.*use_async_quorum=False"):
        make_loader(small_dataset, manager, policy="fixed_global", group_batch_size=None, global_batch_size=8)
    with pytest.raises(ConfigError, match=r"loader_options may not set \['schedule'\]"):
        TorchFTLoader(
            small_dataset.url,
            manager=manager,
            config=TorchFTConfig(seq_len=16, group_batch_size=4),
            loader_options={"schedule": []},
        )
    with pytest.raises(ConfigError, match=r"group_batch_size.*group_world_size 3 divides \(got 4\)"):
        TorchFTLoader(
            small_dataset.url, manager=manager, config=TorchFTConfig(seq_len=16, group_batch_size=4), group_world_size=3
        )


def test_a_checkpointed_state_resumes_with_the_managers_step_at_the_next_rows(small_dataset, manager_factory):
    manager = manager_factory()
    with make_loader(small_dataset, manager) as loader:
        for _ in range(3):
            manager.start_quorum()
            next(loader)
            manager.should_commit()
        checkpoint = {"manager": manager.state_dict(), "dataloader": loader.state_dict()}
    resumed = manager_factory()
    with make_loader(small_dataset, resumed) as loader:
        resumed.load_state_dict(checkpoint["manager"])
        loader.load_state_dict(checkpoint["dataloader"])
        resumed.start_quorum()
        assert sorted(next(loader)["sample_positions"].tolist()) == [12, 13, 14, 15]


def test_microbatches_split_each_step_and_a_step_cut_short_is_an_error(small_dataset, manager_factory):
    manager = manager_factory()
    with make_loader(small_dataset, manager, microbatches=2) as loader:
        manager.start_quorum()
        halves = [next(loader)["sample_positions"].tolist() for _ in range(2)]
        assert sorted(halves[0] + halves[1]) == [0, 1, 2, 3] and len(halves[0]) == 2
        with pytest.raises(TorchFTOrderError, match=r"next\(loader\) 3 times in one quorum .*microbatches=2"):
            next(loader)
        manager.should_commit()
        manager.start_quorum()
        assert sorted(next(loader)["sample_positions"].tolist() + next(loader)["sample_positions"].tolist()) == [
            4,
            5,
            6,
            7,
        ]
        manager.should_commit()
        manager.start_quorum()
        next(loader)
        manager.should_commit()
        manager.start_quorum()
        with pytest.raises(TorchFTOrderError, match=r"after 1 of 2 micro-batches of the last step"):
            next(loader)


def test_best_fit_rows_are_served_again_after_a_failed_commit_and_a_windows_state_is_refused(
    definitions_dataset, manager_factory
):
    from loader_reference import DirectReader
    from zephon_stream import StreamingLoader

    manager = manager_factory()
    served = []
    with make_loader(definitions_dataset, manager, packing="best_fit", seq_len=256) as loader:
        for step in range(4):
            manager.start_quorum()
            served.append(next(loader))
            if step == 1:
                manager.report_error(RuntimeError("injected"))
            manager.should_commit()
        state = loader.state_dict()
    assert state["order"]["packing"] == "best_fit"
    np.testing.assert_array_equal(served[1]["input"].numpy(), served[2]["input"].numpy())
    reader = DirectReader([definitions_dataset.url])
    with StreamingLoader(definitions_dataset.url, seq_len=256, local_batch_size=4, lanes=8, pipeline="threads") as plan:
        for batch in served:
            stream, block, sample = plan.order.sample_at(batch["sample_positions"].numpy())
            for row in range(4):
                tokens = reader.sample(int(stream[row]), int(block[row]), int(sample[row]), 256, "best_fit")
                np.testing.assert_array_equal(batch["input"][row].numpy(), tokens[:-1])
    reader.close()
    windows = manager_factory()
    with make_loader(definitions_dataset, windows, seq_len=256) as loader:
        with pytest.raises(StateMismatchError, match=r"packing: state has 'best_fit', this loader has 'concat'"):
            loader.load_state_dict(state)
        older = {**state, "order": {k: v for k, v in state["order"].items() if k != "packing"}}
        loader.load_state_dict(older)  # Saved before the packing was recorded: windows


def test_a_share_cut_from_a_whole_step_keeps_either_batch_layout():
    # A step read whole and cut into shares (the world does not divide
    # it), the last share padded: the 1-D layout is cut at whole rows.
    from zephon_stream.integrations.torchft_rows import cut_and_pad

    rows, seq_len = 5, 4
    ids = torch.arange(rows * seq_len).view(rows, seq_len)
    step = {
        "input": ids,
        "labels": ids + 100,
        "positions": torch.arange(seq_len).repeat(rows, 1),
        "sample_positions": torch.arange(rows) + 40,
    }
    flat = {key: tensor.reshape(-1) if key != "sample_positions" else tensor for key, tensor in step.items()}
    for start, stop in ((0, 3), (3, 5)):
        by_rows = cut_and_pad(step, start=start, stop=stop, rows=3)
        by_tokens = cut_and_pad(flat, start=start, stop=stop, rows=3)
        assert by_rows["input"].shape == (3, seq_len) and by_tokens["input"].shape == (3 * seq_len,)
        for key, tensor in by_rows.items():
            want = tensor if key == "sample_positions" else tensor.reshape(-1)
            assert torch.equal(by_tokens[key], want), key
    assert by_tokens["sample_positions"].tolist() == [43, 44, -1]
    assert by_tokens["labels"][-seq_len:].tolist() == [-100] * seq_len
    assert by_tokens["input"].untyped_storage().data_ptr() != flat["input"].untyped_storage().data_ptr()


def test_the_tokens_layout_hands_each_microbatch_over_1d_with_the_rows_of_the_rows_layout(
    small_dataset, manager_factory
):
    served = {}
    for layout in ("rows", "tokens"):
        manager = manager_factory()
        with TorchFTLoader(
            small_dataset.url,
            manager=manager,
            config=TorchFTConfig(seq_len=16, group_batch_size=4, lanes=8, microbatches=2),
            loader_options={"pipeline": "threads", "batch_layout": layout},
        ) as loader:
            served[layout] = []
            for _ in range(3):
                manager.start_quorum()
                served[layout] += [next(loader), next(loader)]
                manager.should_commit()
    for tokens, rows in zip(served["tokens"], served["rows"]):
        assert tokens["input"].shape == (2 * 16,) and rows["input"].shape == (2, 16)
        assert torch.equal(tokens["sample_positions"], rows["sample_positions"])
        for key in ("input", "labels", "positions"):
            assert torch.equal(tokens[key], rows[key].reshape(-1)), key
