"""Packed rows: cross-document targets and the document outputs (segment ids,
cu_seqlens, max_seqlen, document lengths), checked against a row-by-row
reference and proved by attention: a mask built from each output gives the
attention computed document by document (torch SDPA on CPU).

Batches are windows of token streams made of whole documents (each ending in
its stream's EOS): rows that start mid-document, documents that run from one
row into the next, an EOS on a row's last input, rows without an EOS, and
rows of streams whose EOS ids differ (one stream's EOS id is an ordinary token
of the other)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packing_reference import check_attention, check_outputs, make_stream
from zephon_stream.errors import ConfigError
from zephon_stream.loader.delivery.widen import widen
from zephon_stream.loader.producer.assembler import StepAssembler
from zephon_stream.loader.ring.row_documents import IGNORE_INDEX, PackingSpec
from zephon_stream.loader.ring.shared_ring import WIDE_KEYS, SharedRing, SlotLayout

EOS_IDS = (0, 1)  # Stream 1's EOS (1) is an ordinary token of stream 0, and 0 of stream 1


# -- batches --------------------------------------------------------------------


class Harness:
    """One CPU ring (wide arrays on the host, as CPU delivery reads them) and
    one laid out for CUDA (nothing wide; ``widen`` runs on CPU tensors here)
    with the same spec, filled by the producer's assembler."""

    def __init__(self, *, rows: int, seq_len: int, spec: PackingSpec) -> None:
        self.rows, self.seq_len, self.spec = rows, seq_len, spec
        self.host = SharedRing.create(
            num_slots=2,
            layout=SlotLayout(rows=rows, seq_len=seq_len, token_dtype="<u2", wide_keys=WIDE_KEYS, packing=spec),
        )
        self.device = SharedRing.create(
            num_slots=2, layout=SlotLayout(rows=rows, seq_len=seq_len, token_dtype="<u2", wide_keys=(), packing=spec)
        )
        self.host_assembler = StepAssembler(seq_len=seq_len, packing=spec)
        self.device_assembler = StepAssembler(seq_len=seq_len, packing=spec)

    def assemble(self, windows: list[np.ndarray], eos: np.ndarray, slot: int) -> tuple[dict, dict]:
        samples = np.zeros(len(windows), np.int64)
        self.host_assembler.assemble(windows, samples, eos, self.host.slot(slot))
        self.device_assembler.assemble(windows, samples, eos, self.device.slot(slot))
        host = self.host.slot(slot)
        start, _ = self.device.slot_range(slot)
        raw = torch.from_numpy(self.device.as_array()[start : start + self.device.layout.device_bytes].copy())
        return {**host.wide, **host.packing}, widen(raw, self.device.layout)

    def close(self) -> None:
        self.host.close()
        self.device.close()


@st.composite
def packed_batches(draw):
    """Two steps of the same shape (both written into one slot, so the second
    must clear what the first left) from two streams with different EOS ids."""
    seq_len = draw(st.integers(1, 24))
    rows = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    streams = []
    for eos in EOS_IDS:
        lengths = draw(st.lists(st.integers(1, 2 * seq_len + 3), min_size=1, max_size=40))
        stream = make_stream(lengths, eos, rng)
        while len(stream) < 3 * (seq_len + 1):
            stream = np.concatenate((stream, make_stream(lengths, eos, rng)))
        streams.append(stream)
    steps = []
    for _ in range(2):
        choices = []
        for _ in range(rows):
            which = draw(st.integers(0, len(streams) - 1))
            # Any offset starts a row mid-document; offsets j * L are
            # consecutive windows, so documents run from one row into the next.
            consecutive = draw(st.booleans())
            limit = len(streams[which]) - seq_len - 1
            offset = draw(st.integers(0, limit // seq_len)) * seq_len if consecutive else draw(st.integers(0, limit))
            choices.append((which, offset))
        steps.append(choices)
    return seq_len, rows, streams, steps


def windows_of(streams, choices, seq_len):
    windows = [streams[which][offset : offset + seq_len + 1] for which, offset in choices]
    eos = np.array([EOS_IDS[which] for which, _ in choices], np.int64)
    return windows, eos


def check_step(harness: Harness, windows, eos, slot: int, seed: int) -> None:
    tokens = np.stack(windows)
    inputs, labels = tokens[:, :-1].astype(np.int64), tokens[:, 1:]
    host, device = harness.assemble(windows, eos, slot)
    check_outputs(host, inputs, labels, eos, harness.spec.ignore)
    check_outputs({key: value.numpy() for key, value in device.items()}, inputs, labels, eos, harness.spec.ignore)
    for key in ("input", "labels", "positions", "segment_ids", "document_lengths", "cu_seqlens"):
        np.testing.assert_array_equal(device[key].numpy(), host[key], err_msg=key)
    check_attention(host, inputs, eos, seed)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=packed_batches(), ignore=st.booleans())
def test_every_output_masks_attention_exactly_as_document_by_document(batch, ignore):
    seq_len, rows, streams, steps = batch
    spec = PackingSpec(cross_document_targets="ignore" if ignore else "predict", outputs=True)
    harness = Harness(rows=rows, seq_len=seq_len, spec=spec)
    try:
        for step, choices in enumerate(steps):
            windows, eos = windows_of(streams, choices, seq_len)
            check_step(harness, windows, eos, slot=0, seed=step)
    finally:
        harness.close()


def test_the_named_cases_each_occur_and_pass():
    """Rows mid-document, a document across rows, an EOS on the last input, a
    row without EOS, two EOS ids in one step; then a step with fewer documents
    written into the same slot."""
    seq_len = 8
    rng = np.random.default_rng(7)
    a = make_stream([3, 5, 20, 2, 9, 1, 1, 6], EOS_IDS[0], rng)
    b = make_stream([4, 8, 13, 7], EOS_IDS[1], rng)
    a[4] = EOS_IDS[1]
    choices = [(0, 1), (0, 9), (0, 17), (1, 0), (1, 4), (0, 31)]
    windows, eos = windows_of([a, b], choices, seq_len)
    tokens = np.stack(windows)
    inputs = tokens[:, :-1]
    is_eos = inputs == eos[:, None]
    assert inputs[0, 0] != eos[0] and a[0] != EOS_IDS[0], "row 0 starts inside the stream's first document"
    assert (~is_eos[1]).all() and (~is_eos[2][:-1]).all(), "the 20-token document spans rows 1 and 2"
    assert is_eos[4, -1], "row 4 ends on an EOS"
    assert (inputs == EOS_IDS[1])[0].any() and not is_eos[0][inputs[0] == EOS_IDS[1]].any(), (
        "stream 1's EOS id is an ordinary token in stream 0's rows"
    )
    spec = PackingSpec(cross_document_targets="ignore", outputs=True)
    harness = Harness(rows=len(choices), seq_len=seq_len, spec=spec)
    try:
        check_step(harness, windows, eos, slot=1, seed=0)
        fewer, fewer_eos = windows_of([a, b], [(0, 9)] * len(choices), seq_len)
        check_step(harness, fewer, fewer_eos, slot=1, seed=1)
    finally:
        harness.close()


def test_predict_keeps_the_shifted_window_and_ignore_masks_only_input_eos():
    seq_len = 8
    rng = np.random.default_rng(3)
    stream = make_stream([3, 4, 9, 2], 0, rng)
    windows, eos = windows_of([stream], [(0, 0), (0, 8)], seq_len)
    for targets in ("predict", "ignore"):
        harness = Harness(rows=2, seq_len=seq_len, spec=PackingSpec(cross_document_targets=targets))
        try:
            host, device = harness.assemble(windows, eos, 0)
            labels = host["labels"]
            tokens = np.stack(windows)
            masked = labels == IGNORE_INDEX
            if targets == "predict":
                np.testing.assert_array_equal(labels, tokens[:, 1:])
            else:
                np.testing.assert_array_equal(masked, tokens[:, :-1] == 0)
                np.testing.assert_array_equal(labels[~masked], tokens[:, 1:][~masked])
                assert (tokens[:, 1:] == 0).sum() > masked.sum() - 1, "an EOS as a target is still trained"
            np.testing.assert_array_equal(device["labels"].numpy(), labels)
            assert "segment_ids" not in host and "cu_seqlens" not in device
            assert (
                harness.host.layout.device_bytes
                == SlotLayout(rows=2, seq_len=seq_len, token_dtype="<u2", wide_keys=()).device_bytes
            )
        finally:
            harness.close()


def test_a_bad_setting_is_refused_by_name():
    with pytest.raises(ConfigError, match="cross_document_targets"):
        PackingSpec(cross_document_targets="mask")
    with pytest.raises(ConfigError, match="packing_outputs"):
        PackingSpec(outputs="yes")


def test_rows_dense_with_documents_take_the_running_sum_and_agree():
    """More than a few document starts per row switch the segment ids to a
    running sum over the step; the outputs are the same."""
    seq_len, rows = 32, 3
    rng = np.random.default_rng(11)
    short = make_stream(rng.integers(1, 4, 200).tolist(), EOS_IDS[0], rng)
    long = make_stream([70, 3], EOS_IDS[1], rng)
    windows, eos = windows_of([short, long], [(0, 5), (0, 40), (1, 10)], seq_len)
    assert (np.stack(windows)[:2, :-1] == 0).sum() > 8 * rows, "dense enough for the running sum"
    harness = Harness(rows=rows, seq_len=seq_len, spec=PackingSpec(cross_document_targets="ignore", outputs=True))
    try:
        sparse, sparse_eos = windows_of([short, long], [(1, 0), (1, 32), (1, 40)], seq_len)
        # Into one slot, so each step clears what the step before left, either way.
        for step, (rows_of, eos_of) in enumerate(
            [(windows, eos), (sparse, sparse_eos), (windows, eos), (sparse, sparse_eos)]
        ):
            check_step(harness, rows_of, eos_of, slot=0, seed=step)
    finally:
        harness.close()


def test_host_labels_of_a_cuda_ring_are_masked_by_the_producer():
    """With CUDA and ``host_labels`` only ``labels`` is wide on the host: the
    producer still scans for EOS to mask them, and ``widen`` masks the device's."""
    seq_len = 8
    rng = np.random.default_rng(5)
    stream = make_stream([3, 4, 9, 2], 0, rng)
    windows, eos = windows_of([stream], [(0, 0), (0, 8)], seq_len)
    spec = PackingSpec(cross_document_targets="ignore", outputs=True)
    layout = SlotLayout(rows=2, seq_len=seq_len, token_dtype="<u2", wide_keys=("labels",), packing=spec)
    ring = SharedRing.create(num_slots=1, layout=layout)
    try:
        StepAssembler(seq_len=seq_len, packing=spec).assemble(windows, np.zeros(2, np.int64), eos, ring.slot(0))
        tokens = np.stack(windows).astype(np.int64)
        want = np.where(tokens[:, :-1] == 0, IGNORE_INDEX, tokens[:, 1:])
        assert (want == IGNORE_INDEX).any()
        np.testing.assert_array_equal(ring.slot(0).wide["labels"], want)
        raw = torch.from_numpy(ring.as_array()[ring.slot_range(0)[0] :][: layout.device_bytes].copy())
        np.testing.assert_array_equal(widen(raw, layout)["labels"].numpy(), want)
    finally:
        ring.close()
