"""Parity with TorchTitan (0.3.0 and main) under ``cross_document_targets="ignore"``
(the TorchTitan config's default).

- Our batches through TorchTitan's own mask helpers (``get_document_mask_mod``,
  ``create_varlen_metadata_for_document``, which read ``positions``) give the
  documents our ``segment_ids`` and ``cu_seqlens`` give, and the valid-token
  count TorchTitan's trainer takes from our labels is ours. On main the batch
  is 1-D and the helpers read its positions whole.
- TorchTitan's own text loader (0.3.0: ``HuggingFaceTextDataset``; main: its
  Grain loader, concatenate then split) over the same documents trains
  exactly the (input, target, position) triples we train, so the same loss on
  the same tokens.

``torchtitan.models.common`` imports its MoE code, which needs triton
(absent from CPU-only installs); ``titan_attention`` then loads the installed
``attention.py`` itself without that package's ``__init__``. Its code is
TorchTitan's, unchanged.
"""

from __future__ import annotations

import collections
import importlib
import json
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra")

from torchtitan.components.loss import IGNORE_INDEX  # noqa: E402
from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402

from fixtures_corpus import EOS_TOKEN  # noqa: E402
from packing_reference import check_attention  # noqa: E402
from titan_forms import titan_own_loader, trainer_keywords  # noqa: E402
from zephon_stream import StreamingLoader, write_dataset  # noqa: E402
from zephon_stream.errors import ConfigError  # noqa: E402
from zephon_stream.integrations.torchtitan import TITAN, ZephonDataLoader  # noqa: E402
from zephon_stream.loader.ring.row_documents import IGNORE_INDEX as OUR_IGNORE_INDEX  # noqa: E402

SEQ_LEN, ROWS = 128, 4


def titan_attention() -> types.ModuleType:
    """``torchtitan.models.common.attention`` as installed."""
    name = "torchtitan.models.common"
    try:
        return importlib.import_module(f"{name}.attention")
    except ModuleNotFoundError as exc:
        if exc.name != "triton":
            raise
    import torchtitan.models

    saved = sys.modules.pop(name, None)
    package = types.ModuleType(name)
    package.__path__ = [str(Path(torchtitan.models.__file__).with_name("common"))]
    sys.modules[name] = package
    try:
        return importlib.import_module(f"{name}.attention")
    finally:
        del sys.modules[name]
        if saved is not None:
            sys.modules[name] = saved


@pytest.fixture(scope="module")
def attention() -> types.ModuleType:
    return titan_attention()


@pytest.fixture(scope="module")
def titan_tokenizer(bpe_tokenizer_json: Path, tmp_path_factory: pytest.TempPathFactory) -> HuggingFaceTokenizer:
    folder = tmp_path_factory.mktemp("titan_tokenizer")
    shutil.copy(bpe_tokenizer_json, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS_TOKEN}))
    return HuggingFaceTokenizer.Config().build(tokenizer_path=str(folder))


def test_our_ignore_index_is_torchtitans():
    assert OUR_IGNORE_INDEX == IGNORE_INDEX


@pytest.mark.parametrize("pipeline", ["process", "threads"])
def test_torchtitans_mask_helpers_see_our_documents_and_count_our_valid_tokens(
    small_dataset, small_bpe_dataset, attention, pipeline
):
    # A mixture of two tokenizers: each row's EOS id is its stream's.
    eos_ids = np.array([small_dataset.manifest.tokenizer.eos_id, small_bpe_dataset.manifest.tokenizer.eos_id])
    streams = [small_dataset.url, small_bpe_dataset.url]
    config = ZephonDataLoader.Config(streams=streams, seed=1, pipeline=pipeline)
    assert config.cross_document_targets == "ignore"
    # The documents as the loader's own packing outputs see them, rank 0 of 2.
    reference = StreamingLoader(
        streams,
        seed=1,
        seq_len=SEQ_LEN,
        local_batch_size=ROWS,
        rank=0,
        world_size=2,
        pipeline="threads",
        packing_outputs=True,
    )
    with (
        reference,
        config.build(dp_world_size=2, dp_rank=0, tokenizer=None, **trainer_keywords(SEQ_LEN, ROWS)) as loader,
    ):
        documents = 0
        for step in range(10):
            input_dict, labels = next(loader)
            want = next(reference)
            positions = input_dict["positions"]
            count = int(want["num_cu_seqlens"])
            assert torch.equal(input_dict["input"].reshape(ROWS, SEQ_LEN), want["input"])

            mask_mod = attention.get_document_mask_mod(positions)
            # A document is (row, segment): 0.3.0's batch holds rows, main's 1-D one its rows end to end.
            if TITAN.flat_batches:
                tokens = torch.arange(ROWS * SEQ_LEN)
                document = tokens // SEQ_LEN * SEQ_LEN + want["segment_ids"].reshape(-1)
                titan_mask = mask_mod(torch.tensor(0), torch.tensor(0), tokens[:, None], tokens[None, :])
                assert torch.equal(titan_mask, document[:, None] == document[None, :])
            else:
                b = torch.arange(ROWS)[:, None, None]
                q, kv = torch.arange(SEQ_LEN)[None, :, None], torch.arange(SEQ_LEN)[None, None, :]
                titan_mask = mask_mod(b, torch.tensor(0), q, kv)
                segment_ids = want["segment_ids"]
                assert torch.equal(titan_mask, segment_ids[:, :, None] == segment_ids[:, None, :])

            metadata = attention.create_varlen_metadata_for_document(positions)
            assert torch.equal(metadata.cu_seq_q, want["cu_seqlens"][:count])
            assert metadata.cu_seq_q.dtype == want["cu_seqlens"].dtype == torch.int32
            assert metadata.max_q == int(want["max_seqlen"])
            documents += count - 1

            # TorchTitan's train_step: ``local_valid_tokens += (labels != IGNORE_INDEX).sum()``.
            titan_valid = int((labels != IGNORE_INDEX).sum())
            piece = loader.streaming_loader.order.rank_slice(step * 2 * ROWS, 2 * ROWS, 2, 0)
            input_eos = int((want["input"] == torch.as_tensor(eos_ids[piece.stream])[:, None]).sum())
            assert titan_valid == ROWS * SEQ_LEN - input_eos
            if step == 0:
                check_attention(want, want["input"].numpy(), eos_ids[piece.stream], seed=step)
        assert documents > 10 * ROWS, "the steps hold document boundaries"


def test_packing_outputs_go_in_the_input_dict_on_0_3_0_and_are_refused_on_main(small_bpe_dataset):
    if TITAN.flat_batches:
        with pytest.raises(ConfigError, match="builds its document masks from positions"):
            ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, packing_outputs=True)
        return
    config = ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, packing_outputs=True, pipeline="threads")
    with config.build(dp_world_size=1, dp_rank=0, tokenizer=None, **trainer_keywords(SEQ_LEN, ROWS)) as loader:
        input_dict, _ = next(loader)
    assert {"segment_ids", "document_lengths", "cu_seqlens", "num_cu_seqlens", "max_seqlen"} <= set(input_dict)
    count, max_seqlen = input_dict["num_cu_seqlens"], input_dict["max_seqlen"]
    assert isinstance(count, int) and isinstance(max_seqlen, int), "ints: the trainer moves no tensor of them"


def trained_triples(inputs: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor) -> collections.Counter:
    keep = labels != IGNORE_INDEX
    return collections.Counter(zip(inputs[keep].tolist(), labels[keep].tolist(), positions[keep].tolist()))


@pytest.mark.parametrize("first", [0, 9, 17])
def test_torchtitans_own_text_loader_trains_what_we_train_under_ignore(
    stdlib_corpus, bpe_tokenizer_json, titan_tokenizer, tmp_path, first
):
    texts = [text[:1500] for text in stdlib_corpus.texts[first : first + 6]]
    documents = [titan_tokenizer.encode(text, add_bos=True, add_eos=True) for text in texts]
    assert all(doc[-1] == titan_tokenizer.eos_id for doc in documents)
    num_tokens = sum(len(doc) for doc in documents)

    # TorchTitan's own loader: each document's inputs and labels shifted within
    # it; one row (main: one batch) of every pair it trains.
    folder = tmp_path / "c4_like"
    folder.mkdir()
    (folder / "data.json").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    if TITAN.flat_batches:
        titan = titan_own_loader(
            rank=0,
            world=1,
            seq_len=max(map(len, documents)),
            rows=1,
            tokenizer=titan_tokenizer,
            corpus_jsonl=str(folder / "data.json"),
            num_tokens=num_tokens - len(documents),
        )
        (titan_dict, titan_labels), titan = next(iter(titan)), titan.close()
        titan_input, titan_positions = titan_dict["input"], titan_dict["positions"]
    else:
        from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

        titan = HuggingFaceTextDataset("c4_test", str(folder), titan_tokenizer, seq_len=num_tokens - len(documents))
        (((titan_input, titan_positions), titan_labels),) = [
            ((d["input"], d["positions"]), labels) for d, labels in titan
        ]

    # Ours: the same documents written as a dataset; one row of the whole stream.
    sources = []
    for index, text in enumerate(texts):
        path = tmp_path / f"doc{index}.txt"
        path.write_text(text, encoding="utf-8")
        sources.append(str(path))
    url = str(tmp_path / "dataset")
    write_dataset(sources, url, tokenizer=f"hf:{bpe_tokenizer_json}", eos_token=EOS_TOKEN, progress=False)
    ours = {}
    for targets in ("ignore", "predict"):
        with StreamingLoader(
            url,
            seq_len=num_tokens - 1,
            local_batch_size=1,
            pipeline="threads",
            cross_document_targets=targets,
            packing_outputs=True,
        ) as loader:
            ours[targets] = next(loader)
    batch = ours["ignore"]
    assert batch["input"][0].tolist() == [t for doc in documents for t in doc][:-1], "the same token ids"

    titan_triples = trained_triples(titan_input, titan_labels, titan_positions)
    our_triples = trained_triples(batch["input"][0], batch["labels"][0], batch["positions"][0])
    assert our_triples == titan_triples
    assert int((batch["labels"] != IGNORE_INDEX).sum()) == titan_labels.numel() == num_tokens - len(documents)
    assert int(batch["num_cu_seqlens"]) - 1 == len(documents)
    # "predict" trains, besides, each EOS -> next document's first token.
    extra = trained_triples(ours["predict"]["input"][0], ours["predict"]["labels"][0], ours["predict"]["positions"][0])
    extra.subtract(our_triples)
    cross = [(doc[-1], nxt[0], len(doc) - 1) for doc, nxt in zip(documents, documents[1:])]
    assert +extra == collections.Counter(cross)


def test_a_trainer_builds_torchtitans_varlen_metadata_from_our_outputs(small_bpe_dataset, attention):
    """The docs' recipe on 0.3.0: VarlenMetadata straight from ``cu_seqlens`` and
    ``max_seqlen``, without the per-row loop and device sync of deriving it
    (main derives it from positions itself and takes no packing outputs)."""
    if TITAN.flat_batches:
        pytest.skip("TorchTitan main takes no packing outputs (refused: see the test above)")
    config = ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, packing_outputs=True, pipeline="threads")
    with config.build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=SEQ_LEN, local_batch_size=ROWS) as loader:
        for _ in range(3):
            input_dict, _ = next(loader)
            cu_seqlens = input_dict.pop("cu_seqlens")[: input_dict.pop("num_cu_seqlens")]
            max_seqlen = input_dict.pop("max_seqlen")
            ours = attention.VarlenMetadata(
                cu_seq_q=cu_seqlens, cu_seq_k=cu_seqlens, max_q=max_seqlen, max_k=max_seqlen
            )
            theirs = attention.create_varlen_metadata_for_document(input_dict["positions"])
            assert torch.equal(ours.cu_seq_q, theirs.cu_seq_q) and ours.max_q == theirs.max_q
