"""The helper process and the batch ring: the same batches as the in-process
pipeline, the narrow rows widened by torch equal the host assembly, and no
way of ending (close, SIGKILL of the helper, SIGKILL of the trainer) leaves a
process, a /dev/shm segment or a thread behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from loader_reference import run_step_hashes, steps_until_the_helper_serves
from tools.reliability.common import process_table
from zephon_stream import StreamingLoader
from zephon_stream.errors import ConfigError, HelperProcessError
from zephon_stream.loader.delivery.widen import widen
from zephon_stream.loader.front.api import HELPER_PROCESS_BYTES
from zephon_stream.loader.producer.assembler import StepAssembler
from zephon_stream.loader.producer.process_producer import ProcessProducer
from zephon_stream.loader.ring.liveness import OWNER_DIED
from zephon_stream.loader.ring.shared_ring import WIDE_KEYS, SharedRing, SlotLayout


def process_state(pid: int) -> str | None:
    """The process's state letter (``Z`` for a zombie), None once it is gone."""
    return process_table().get(pid, (None, 0))[0]


def wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # A killed process's leader shows "Z" while its other threads
        # still exit, and waitpid does not report it until they have; for a
        # child of ours, ask waitid without reaping it.
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            if process_state(pid) in (None, "Z", "X"):
                return True
        time.sleep(0.05)
    return False


def helpers_running() -> set[int]:
    """Pids of every live zephon helper process on this machine."""
    found = set()
    for pid, (state, _) in process_table().items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if state != "Z" and b"zephon_stream.loader.producer.helper_main" in cmdline.read():
                    found.add(pid)
        except OSError:
            continue
    return found


def our_helpers() -> set[int]:
    """Pids of the live helper processes this test process started (other
    jobs on the machine may run helpers of their own)."""
    table = process_table()
    return {pid for pid in helpers_running() if table.get(pid, (None, 0))[1] == os.getpid()}


def shm_entries() -> set[str]:
    """Names in /dev/shm, less multiprocessing's semaphores, torch's shared
    tensors and the node cache's folder: other processes of the machine make
    and drop the first two meanwhile (a DataLoader's workers pass batches as
    ``torch_*`` segments), torchrun ranks of tests running in parallel
    (pytest-xdist) the third, and a loader outside torchrun makes none. A
    test checks that none is new: others' segments may go meanwhile."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {name for name in os.listdir("/dev/shm") if not name.startswith(("sem.mp-", "torch_", "zephon-node-cache-"))}


@pytest.mark.parametrize("world_size", [1, 3])
def test_the_helper_process_reads_what_the_in_process_pipeline_reads(small_dataset, world_size):
    def loaders(pipeline):
        return [
            StreamingLoader(
                small_dataset.url,
                seq_len=128,
                local_batch_size=6 // world_size * 2,
                world_size=world_size,
                rank=r,
                seed=4,
                pipeline=pipeline,
            )
            for r in range(world_size)
        ]

    hashes = {}
    for pipeline in ("threads", "process"):
        group = loaders(pipeline)
        try:
            hashes[pipeline] = run_step_hashes(group, 40)
        finally:
            for loader in group:
                loader.close()
    assert hashes["process"] == hashes["threads"]


@pytest.mark.parametrize("batch_layout", ["rows", "tokens"])
@pytest.mark.parametrize("unsigned_copy", [True, False])
@pytest.mark.parametrize("token_dtype", ["<u2", "<u4"])
def test_narrow_rows_widened_by_torch_equal_the_host_assembly(token_dtype, unsigned_copy, batch_layout, monkeypatch):
    # False takes the signed-view-and-mask path, for a device (or a torch
    # older than 2.3) without copy kernels for torch's unsigned dtypes. The
    # "tokens" layout is what CUDA delivery hands over for it: the rows end to end.
    if not unsigned_copy:
        monkeypatch.setattr("zephon_stream.loader.delivery.widen._UNSIGNED_COPY_DEVICES", ())
    rows, seq_len = 5, 64
    rng = np.random.default_rng(7)
    vocab = 300 if token_dtype == "<u2" else 2**32 - 1
    block = rng.integers(0, vocab, size=8 * seq_len + 1).astype(token_dtype)
    block[rng.choice(block.size, 40, replace=False)] = 17  # EOS of even rows
    block[rng.choice(block.size, 40, replace=False)] = 29  # EOS of odd rows
    block[seq_len - 1] = 17  # EOS as a row's last input token starts nothing inside it
    eos = np.array([17, 29, 17, 29, 17])
    ring = SharedRing.create(
        num_slots=1, layout=SlotLayout(rows=rows, seq_len=seq_len, token_dtype=token_dtype, wide_keys=WIDE_KEYS)
    )
    slot = ring.slot(0)
    StepAssembler(seq_len=seq_len).assemble([block] * rows, np.array([0, 3, 7, 1, 0]), eos, slot)
    slot.sample_positions[:] = np.arange(100, 100 + rows)
    raw = torch.from_numpy(ring.slab(0)[: ring.layout.device_bytes])
    got = widen(raw, ring.layout, batch_layout)
    for key in WIDE_KEYS:
        assert got[key].dtype == torch.int64
        want = slot.wide[key].reshape(-1) if batch_layout == "tokens" else slot.wide[key]
        assert got[key].shape == want.shape, key
        np.testing.assert_array_equal(got[key].numpy(), want, err_msg=key)
    np.testing.assert_array_equal(got["sample_positions"].numpy(), np.arange(100, 100 + rows))
    assert (got["positions"] == 0).sum() > rows, "the rows should hold document starts"
    del slot, raw, got
    ring.close()


def test_a_killed_helper_raises_at_the_next_step_naming_it(small_dataset):
    shm = shm_entries()
    loader = StreamingLoader(small_dataset.url, seq_len=128, local_batch_size=4, prefetch_steps=4)
    taken = steps_until_the_helper_serves(loader)
    kept = [next(loader) for _ in range(3)]
    pid = loader.helper_pid
    with open(f"/proc/{pid}/maps") as maps:
        mapped = maps.read()
    assert "/memfd:zephon-ring" in mapped and "/dev/shm" not in mapped  # A ring with no name
    lock_word = loader.ring.helper_lock_word
    assert lock_word[0] == pid, "the helper holds its liveness lock: no system call per step to know it lives"
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid)
    assert lock_word[0] & OWNER_DIED, "the kernel marks the lock of the killed helper"
    step = taken + 3
    with pytest.raises(
        HelperProcessError, match=rf"helper process \(pid {pid}\) was killed by SIGKILL while step {step} "
    ):
        next(loader)
    with pytest.raises(HelperProcessError):  # And at every later step
        next(loader)
    assert loader.position == step * 4
    assert all(batch["input"].shape == (4, 128) for batch in kept)
    loader.close()
    assert pid not in helpers_running() and not shm_entries() - shm


def test_a_killed_trainer_takes_its_helper_with_it(small_dataset, tmp_path):
    shm = shm_entries()
    script = tmp_path / "trainer.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, time
        from zephon_stream import StreamingLoader
        loader = StreamingLoader({small_dataset.url!r}, seq_len=128, local_batch_size=4)
        while loader.helper_pid is None:
            next(loader)
            time.sleep(0.02)
        print(loader.helper_pid, flush=True)
        time.sleep(120)
    """)
    )
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        helper = int(trainer.stdout.readline())
        assert process_state(helper) not in (None, "Z")
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=30)
        assert wait_gone(helper), f"helper {helper} outlived its trainer"
    finally:
        trainer.kill()
        trainer.wait()
        trainer.stdout.close()
    assert helper not in helpers_running()
    assert not shm_entries() - shm


@pytest.mark.parametrize("where", ["local", "s3"])
def test_the_helper_imports_no_torch_and_fits_its_memory_allowance(small_dataset, where, request):
    url, options = small_dataset.url, None
    if where == "s3":
        from zephon_stream.storage import copy_dataset

        bucket = request.getfixturevalue("s3_bucket")
        url, options = bucket.url("data"), bucket.storage_options
        copy_dataset(small_dataset.url, url, dst_options=options)
    with StreamingLoader(url, seq_len=128, local_batch_size=4, storage_options=options) as loader:
        steps_until_the_helper_serves(loader)
        for _ in range(20):
            next(loader)
        pid = loader.helper_pid
        with open(f"/proc/{pid}/status") as status:
            rss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
        with open(f"/proc/{pid}/maps") as maps:
            mapped = maps.read()
    assert "libtorch" not in mapped, "the helper imported torch"
    assert rss < HELPER_PROCESS_BYTES, (rss, HELPER_PROCESS_BYTES)


@pytest.mark.parametrize("pipeline", ["process", "threads"])
def test_batches_are_views_of_the_ring_unless_the_consumer_hoards_them(small_dataset, pipeline):
    # 128 rows of 128 tokens: one step a ring slot (SLOT_TOKENS).
    with StreamingLoader(small_dataset.url, seq_len=128, local_batch_size=128, pipeline=pipeline) as loader:
        if pipeline == "process":
            steps_until_the_helper_serves(loader)  # From here on, one ring
        low, high = loader.ring.address(), loader.ring.address() + loader.ring.nbytes

        def in_ring(batch):
            return all(low <= tensor.data_ptr() < high for tensor in batch.values())

        for _ in range(20):
            batch = next(loader)  # The step before this one is dropped here
            assert in_ring(batch)
        kept = [next(loader) for _ in range(6)]
        assert [in_ring(b) for b in kept] == [True, False, False, False, False, False]


@pytest.mark.parametrize("pipeline", ["process", "threads"])
def test_small_steps_share_a_slot_and_a_hoarding_consumer_still_gets_every_step(small_dataset, pipeline):
    # 4 rows of 128 tokens: 16 steps a slot, handed over as views; the
    # slots a consumer keeps count as held batches.
    with StreamingLoader(small_dataset.url, seq_len=128, local_batch_size=4, pipeline=pipeline, seed=2) as loader:
        if pipeline == "process":
            steps_until_the_helper_serves(loader)
        start = loader.position
        low, high = loader.ring.address(), loader.ring.address() + loader.ring.nbytes
        kept = [next(loader) for _ in range(80)]
        views = [all(low <= t.data_ptr() < high for t in batch.values()) for batch in kept]
        assert views[:16] == [True] * 16 and not any(views[48:])
    with StreamingLoader(small_dataset.url, seq_len=128, local_batch_size=4, pipeline="threads", seed=2) as reference:
        reference.load_state_dict({**reference.state_dict(), "position": start})
        for batch in kept:
            expected = next(reference)
            assert all(torch.equal(batch[key], expected[key]) for key in expected)


@pytest.mark.parametrize("pipeline", ["process", "threads"])
def test_a_slot_is_not_refilled_while_the_consumer_keeps_views_derived_from_its_tensors(small_dataset, pipeline):
    # A slot's tensors are made once and handed over again; what the
    # consumer derives from them (a slice, a detach(), a numpy view) must keep
    # the slot from the producer as the tensors themselves do.
    settings = {"seq_len": 128, "local_batch_size": 4, "seed": 5}
    with StreamingLoader(small_dataset.url, pipeline=pipeline, **settings) as loader:
        if pipeline == "process":
            steps_until_the_helper_serves(loader)
        start = loader.position
        kept = []
        for step in range(60):
            batch = next(loader)
            derived = (batch["input"][:, :16], batch["labels"].detach(), batch["positions"].numpy()[:, 3:])
            kept.append(derived if step % 3 == 0 else None)
            del batch, derived
        for _ in range(200):
            next(loader)
    with StreamingLoader(small_dataset.url, pipeline="threads", **settings) as reference:
        reference.load_state_dict({**reference.state_dict(), "position": start})
        for derived in kept:
            expected = next(reference)
            if derived is not None:
                assert torch.equal(derived[0], expected["input"][:, :16])
                assert torch.equal(derived[1], expected["labels"])
                assert np.array_equal(derived[2], expected["positions"].numpy()[:, 3:])


def test_a_helper_loads_its_streams_client_libraries_and_skips_schemes_it_cannot():
    # The S3 client library is loaded before the helper says it is
    # ready; a scheme with no library (or none installed) is left to the store
    # that needs it, which names what to install.
    mapped = {}
    for schemes in ((), ("s3", "no-such-scheme")):
        helper = ProcessProducer(nice=3, schemes=schemes)
        try:
            deadline = time.monotonic() + 60
            while not helper.ready():
                assert time.monotonic() < deadline, f"the helper ({schemes}) never said it was ready"
                time.sleep(0.01)
            assert os.getpriority(os.PRIO_PROCESS, helper.pid) == os.getpriority(os.PRIO_PROCESS, 0) + 3
            with open(f"/proc/{helper.pid}/maps") as maps:
                mapped[schemes] = maps.read()
        finally:
            helper.close()
        assert helper.reaped()
    # aiohttp (s3fs's HTTP client) has native parts: mapped once it is imported.
    assert "aiohttp" not in mapped[()]
    assert "aiohttp" in mapped[("s3", "no-such-scheme")]
    assert all("libtorch" not in text for text in mapped.values())


def test_the_helper_runs_at_the_niceness_asked_for(small_dataset):
    for nice in (0, 10):
        with StreamingLoader(small_dataset.url, seq_len=128, local_batch_size=4, helper_nice=nice) as loader:
            steps_until_the_helper_serves(loader)
            assert os.getpriority(os.PRIO_PROCESS, loader.helper_pid) == os.getpriority(os.PRIO_PROCESS, 0) + nice
    with pytest.raises(ConfigError, match="helper_nice"):
        StreamingLoader(small_dataset.url, seq_len=128, local_batch_size=4, helper_nice=25)


def test_a_run_the_helper_takes_over_from_threads_reads_what_threads_read(small_dataset):
    # The first steps come from threads of this process while the
    # helper starts; it takes over at a step boundary some steps ahead.
    with StreamingLoader(small_dataset.url, seq_len=128, local_batch_size=4, seed=3) as loader:
        hashes, served_by = [], []
        while len(served_by) < 2 or served_by[-1] is None or len(hashes) < served_by.index(loader.helper_pid) + 10:
            hashes += run_step_hashes([loader], 1)
            served_by.append(loader.helper_pid)
            time.sleep(0.01)
    assert served_by[0] is None and served_by[-1] is not None, "the helper never took over"
    with StreamingLoader(small_dataset.url, seq_len=128, local_batch_size=4, seed=3, pipeline="threads") as threads:
        assert run_step_hashes([threads], len(hashes)) == hashes


@pytest.mark.parametrize("moment", ["while_it_starts", "while_it_takes_over"])
def test_a_helper_killed_during_a_hand_over_raises_and_leaves_nothing(small_dataset, moment):
    shm = shm_entries()
    loader = StreamingLoader(small_dataset.url, seq_len=128, local_batch_size=4)
    if moment == "while_it_takes_over":
        deadline = time.monotonic() + 120
        # The helper has been given the rest of the run from a cursor ahead; threads still serve.
        while loader._feed.next_start is None:
            assert time.monotonic() < deadline
            next(loader)
            time.sleep(0.01)
        assert loader.helper_pid is None
    (pid,) = our_helpers()
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid)
    with pytest.raises(HelperProcessError, match=rf"helper process \(pid {pid}\) was killed by SIGKILL"):
        for _ in range(10_000):
            next(loader)
    with pytest.raises(HelperProcessError):
        next(loader)
    loader.close()
    assert our_helpers() == set() and not shm_entries() - shm
