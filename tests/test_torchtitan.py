"""ZephonDataLoader inside TorchTitan: built as the trainer builds it, checkpointed
by TorchTitan's own CheckpointManager, resumed at other dp degrees.

The multi-rank tests run real ranks under ``torchrun`` (gloo, CPU) with the
dataset on a moto S3 server on loopback; the workers live in tests/dist_titan.
They run against the installed TorchTitan 0.3.0 and, in
tests/test_torchtitan_main.py, against TorchTitan main.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.abc
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchtitan", reason="needs the [torchtitan] extra")

from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402

from titan_forms import TITAN_OWN_REFUSAL, as_rows, repeat, titan_own_entries, trainer_keywords  # noqa: E402
from zephon_stream.errors import ConfigError, StateMismatchError, TokenizerError  # noqa: E402
from zephon_stream.integrations.torchtitan import (  # noqa: E402
    STATE_KEY,
    TITAN,
    DataloaderExhaustedError,
    ZephonDataLoader,
    parse_stream_spec,
)

REPO = Path(__file__).resolve().parents[1]
WORKERS = REPO / "tests" / "dist_titan"
EOS_TOKEN = "<|endoftext|>"


def _load_worker_module(name: str):
    """A module of tests/dist_titan (the workers import it as a sibling)."""
    spec = importlib.util.spec_from_file_location(f"dist_titan_{name}", WORKERS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


titan_setup = _load_worker_module("titan_setup")


@pytest.fixture(scope="module")
def titan_tokenizer_dir(bpe_tokenizer_json: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The BPE fixture as a TorchTitan ``hf_assets_path`` folder."""
    folder = tmp_path_factory.mktemp("titan_tokenizer")
    shutil.copy(bpe_tokenizer_json, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS_TOKEN}))
    return folder


@pytest.fixture(scope="module")
def titan_tokenizer(titan_tokenizer_dir: Path) -> HuggingFaceTokenizer:
    return HuggingFaceTokenizer.Config().build(tokenizer_path=str(titan_tokenizer_dir))


def build(config: ZephonDataLoader.Config, *, dp_world_size: int = 1, dp_rank: int = 0, **kwargs) -> ZephonDataLoader:
    """``config.build`` with the keywords the installed TorchTitan's trainer
    passes (``seq_len`` and ``local_batch_size`` given here become main's
    ``max_context_length`` and ``num_tokens_per_batch`` there)."""
    kwargs.setdefault("tokenizer", None)
    if not TITAN.flat_batches:
        kwargs.setdefault("snapshot_every_n_steps", None)
    if "seq_len" in kwargs and "local_batch_size" in kwargs:
        kwargs.update(trainer_keywords(kwargs.pop("seq_len"), kwargs.pop("local_batch_size")))
    return config.build(dp_world_size=dp_world_size, dp_rank=dp_rank, **kwargs)


def take(loader: ZephonDataLoader, num_steps: int) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    batches = iter(loader)
    return [next(batches) for _ in range(num_steps)]


# -- in one process ----------------------------------------------------------------


def test_config_build_yields_titan_batches(small_bpe_dataset, titan_tokenizer):
    config = ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, seed=3)
    with build(config, tokenizer=titan_tokenizer, seq_len=256, local_batch_size=4) as loader:
        batches = take(loader, 10)
    (input_dict, labels), (second, _) = batches[:2]
    assert set(input_dict) == {"input", "positions"}
    # 0.3.0 trains [B, L] batches; main 1-D ones of its token budget, the rows end to end.
    shape = (4 * 256,) if TITAN.flat_batches else (4, 256)
    for tensor in (input_dict["input"], input_dict["positions"], labels):
        assert tensor.shape == shape and tensor.dtype == torch.int64 and tensor.device.type == "cpu"
    assert not torch.equal(input_dict["input"], second["input"])
    tokens = torch.cat([as_rows(d["input"], 256) for d, _ in batches])
    positions = torch.cat([as_rows(d["positions"], 256) for d, _ in batches])
    labels = torch.cat([as_rows(lab, 256) for _, lab in batches])
    is_eos = tokens == titan_tokenizer.eos_id
    # The default: an input EOS's label is IGNORE_INDEX (its next token starts another document).
    assert (labels[is_eos] == -100).all()
    assert torch.equal(tokens[:, 1:][~is_eos[:, :-1]], labels[:, :-1][~is_eos[:, :-1]])
    after_eos = torch.zeros_like(tokens, dtype=torch.bool)
    after_eos[:, 1:] = tokens[:, :-1] == titan_tokenizer.eos_id
    assert after_eos.sum() >= 2, "ten batches of real files should hold document boundaries"
    assert (positions[after_eos] == 0).all()
    inside = ~after_eos
    inside[:, 0] = False
    assert (positions[inside] == torch.roll(positions, 1, dims=1)[inside] + 1).all()


@pytest.mark.parametrize("local_batch_size", [4, 64])
def test_the_streaming_loader_hands_over_the_installed_titans_form_itself(small_bpe_dataset, local_batch_size):
    # Main's 1-D tensors are the delivery's own, made once per ring
    # slot (batch_layout="tokens"), not views made again each step; 4 x 256
    # tokens share a slot with other steps, 64 x 256 fill one.
    config = ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, seed=3, pipeline="threads")
    with build(config, seq_len=256, local_batch_size=local_batch_size) as loader:
        inner = loader.streaming_loader
        assert inner.batch_layout == TITAN.batch_layout == ("tokens" if TITAN.flat_batches else "rows")
        for _ in range(40):
            input_dict, labels = next(loader)
            cached = {
                id(tensor)
                for views in inner.delivery.views
                if views is not None
                for part in (views.whole, *views.steps)
                for tensor in part.values()
            }
            assert {id(input_dict["input"]), id(input_dict["positions"]), id(labels)} <= cached
            assert input_dict["input"].dim() == (1 if TITAN.flat_batches else 2)
            del input_dict, labels


def test_state_dict_is_one_key_equal_on_every_rank(small_bpe_dataset):
    config = ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url)
    states = []
    for rank in range(2):
        with build(config, dp_world_size=2, dp_rank=rank, seq_len=64, local_batch_size=3) as loader:
            take(loader, 3)
            states.append(loader.state_dict())
    assert list(states[0]) == [STATE_KEY]
    assert states[0] == states[1]
    assert json.loads(states[0][STATE_KEY])["position"] == 3 * 2 * 3


def _hash_rows(rows: list) -> str:
    positions = [position for position, _ in rows]
    assert len(set(positions)) == len(positions), "a sample was delivered to two ranks"
    return hashlib.sha256(json.dumps(sorted(rows)).encode()).hexdigest()


def rows_of(loader: ZephonDataLoader, input_dict: dict[str, torch.Tensor], labels: torch.Tensor) -> list:
    """``[global sample position, row digest]`` for each row of the batch just taken."""
    digests = titan_setup.row_digests(input_dict["input"], labels, loader.seq_len)
    return [list(row) for row in zip(loader.last_sample_positions.tolist(), digests)]


def reference_hashes(config: ZephonDataLoader.Config, *, seq_len: int, global_batch: int, num_steps: int) -> dict:
    """The uninterrupted run's step hashes: one rank holding the whole global batch."""
    with build(config, seq_len=seq_len, local_batch_size=global_batch) as reference:
        batches = iter(reference)
        return {step: _hash_rows(rows_of(reference, *next(batches))) for step in range(num_steps)}


def resumed_hashes(config, state, *, dp: int, seq_len: int, local_batch_size: int, steps: range) -> list[str]:
    """Step hashes of ``dp`` ranks that load ``state`` and read ``steps`` (they start at ``steps[0]``)."""
    resumed = [
        build(config, dp_world_size=dp, dp_rank=r, seq_len=seq_len, local_batch_size=local_batch_size)
        for r in range(dp)
    ]
    try:
        for loader in resumed:
            loader.load_state_dict(state)
        iters = [iter(loader) for loader in resumed]
        return [
            _hash_rows([row for loader, it in zip(resumed, iters) for row in rows_of(loader, *next(it))]) for _ in steps
        ]
    finally:
        for loader in resumed:
            loader.close()


def test_load_state_dict_resumes_at_another_dp_degree_in_process(small_bpe_dataset):
    config = ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, seed=11)
    expected = reference_hashes(config, seq_len=32, global_batch=6, num_steps=5)
    saving = [build(config, dp_world_size=3, dp_rank=r, seq_len=32, local_batch_size=2) for r in range(3)]
    for loader in saving:
        take(loader, 2)
    state = saving[0].state_dict()
    for loader in saving:
        loader.close()
    assert resumed_hashes(config, state, dp=2, seq_len=32, local_batch_size=3, steps=range(2, 5)) == [
        expected[step] for step in range(2, 5)
    ]


def test_best_fit_batches_resume_at_another_dp_degree_and_refuse_a_windows_checkpoint(definitions_dataset):
    from loader_reference import DirectReader

    config = ZephonDataLoader.Config(dataset_path=definitions_dataset.url, seed=11, packing="best_fit")
    expected = reference_hashes(config, seq_len=128, global_batch=6, num_steps=5)
    assert expected != reference_hashes(
        dataclasses.replace(config, packing="concat"), seq_len=128, global_batch=6, num_steps=5
    )
    reader = DirectReader([definitions_dataset.url])
    saving = [build(config, dp_world_size=3, dp_rank=r, seq_len=128, local_batch_size=2) for r in range(3)]
    for loader in saving:
        input_dict, labels = take(loader, 2)[-1]
        order = loader._loader.order
        stream, block, sample = order.sample_at(loader.last_sample_positions.numpy())
        for row in range(2):
            tokens = reader.sample(int(stream[row]), int(block[row]), int(sample[row]), 128, "best_fit")
            assert as_rows(input_dict["input"], 128)[row].tolist() == tokens[:-1].tolist()
    state = saving[0].state_dict()
    for loader in saving:
        loader.close()
    reader.close()
    assert resumed_hashes(config, state, dp=2, seq_len=128, local_batch_size=3, steps=range(2, 5)) == [
        expected[step] for step in range(2, 5)
    ]
    with build(dataclasses.replace(config, packing="concat"), seq_len=128, local_batch_size=6) as windows:
        with pytest.raises(StateMismatchError, match="packing .*checkpoint has 'best_fit', this loader has 'concat'"):
            windows.load_state_dict(state)
    with pytest.raises(ConfigError, match="packing must be one of"):
        ZephonDataLoader.Config(dataset_path=definitions_dataset.url, packing="bestfit")


def test_skip_steps_skips_the_data_of_train_steps_once_at_any_dp_degree(small_bpe_dataset):
    config = ZephonDataLoader.Config(
        dataset_path=small_bpe_dataset.url, seed=11, skip_steps=["3:2"], gradient_accumulation_steps=2
    )
    with build(config, seq_len=32, local_batch_size=6) as loader:
        steps = []
        for _ in range(6):
            take(loader, 1)
            steps.append(loader._loader.step - 1)  # The step just read
        state = loader.state_dict()
    # Train step 3 starts at batch 4 (2 a step): batches 4 to 7 (train steps 3 and 4) are skipped.
    assert steps == [0, 1, 2, 3, 8, 9]
    resumed = [build(config, dp_world_size=2, dp_rank=r, seq_len=32, local_batch_size=3) for r in range(2)]
    for loader in resumed:
        loader.load_state_dict(state)
        take(loader, 1)
        assert loader._loader.step == 11  # Resumed after the skip: it does not skip again
        loader.close()
    with pytest.raises(ConfigError, match=r"skip_steps: '3' is not TRAIN_STEP:NUM_STEPS"):
        ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, skip_steps=["3"])


def test_load_state_dict_refuses_a_per_rank_titan_state(small_bpe_dataset):
    with build(ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url), seq_len=32, local_batch_size=2) as loader:
        with pytest.raises(StateMismatchError, match="dp_rank_0"):
            loader.load_state_dict({"dp_rank_0": b"...", "world_size": 4})
        loader.load_state_dict({})  # a fresh start, as TorchTitan's loaders allow


def test_load_state_dict_refuses_another_seed_naming_both(small_bpe_dataset):
    with build(
        ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, seed=1), seq_len=32, local_batch_size=2
    ) as loader:
        take(loader, 1)
        state = loader.state_dict()
    with build(
        ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, seed=2), seq_len=32, local_batch_size=2
    ) as other:
        with pytest.raises(StateMismatchError, match="seed") as info:
            other.load_state_dict(state)
    assert "1" in str(info.value) and "2" in str(info.value)


def test_tokenizer_mismatch_names_both_values(small_dataset, titan_tokenizer):
    config = ZephonDataLoader.Config(dataset_path=small_dataset.url)
    with pytest.raises(TokenizerError) as info:
        build(config, tokenizer=titan_tokenizer, seq_len=32, local_batch_size=2)
    message = str(info.value)
    assert str(small_dataset.manifest.tokenizer.vocab_size) in message
    assert str(titan_tokenizer.get_vocab_size()) in message


def test_both_torchtitans_keywords_give_the_same_rows_and_a_token_budget_pads_on_main(small_bpe_dataset, caplog):
    config = ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, seed=5)
    plain = {"dp_world_size": 1, "dp_rank": 0, "tokenizer": None}
    with config.build(**plain, seq_len=32, local_batch_size=4) as old_style:
        expected = take(old_style, 2)
    with config.build(**plain, max_context_length=32, num_tokens_per_batch=128) as new_style:
        got = take(new_style, 2)
    for (want_dict, want_labels), (got_dict, got_labels) in zip(expected, got):
        assert torch.equal(as_rows(want_dict["input"], 32), as_rows(got_dict["input"], 32))
        assert torch.equal(as_rows(want_labels, 32), as_rows(got_labels, 32))
    if TITAN.flat_batches:
        # Main: 100 tokens = 3 rows of 32 and 4 tokens of padding, as main's own collator pads.
        with config.build(**plain, seq_len=32, local_batch_size=3) as three_rows:
            want_dict, want_labels = take(three_rows, 1)[0]
        with caplog.at_level("WARNING", logger="zephon_stream.integrations"):
            with config.build(**plain, max_context_length=32, num_tokens_per_batch=100) as padded:
                input_dict, labels = take(padded, 1)[0]
        assert "3 rows and 4 padding tokens" in caplog.text
        assert input_dict["input"].shape == labels.shape == input_dict["positions"].shape == (100,)
        assert torch.equal(input_dict["input"][:96], want_dict["input"])
        assert torch.equal(labels[:96], want_labels)
        assert input_dict["input"][96:].tolist() == [0] * 4 and labels[96:].tolist() == [-100] * 4
        assert input_dict["positions"][96:].tolist() == [0, 1, 2, 3]
    else:
        with pytest.raises(ConfigError, match="not a multiple of seq_len 32"):
            config.build(**plain, max_context_length=32, num_tokens_per_batch=100)
    with pytest.raises(ConfigError, match="less than one row"):
        config.build(**plain, max_context_length=32, num_tokens_per_batch=31)
    with pytest.raises(ConfigError, match="disagree"):
        config.build(**plain, seq_len=64, max_context_length=32, local_batch_size=2)


def test_stream_specs_parse_urls_with_and_without_weights():
    assert parse_stream_spec("s3://bucket/data/web:0.7") == ("s3://bucket/data/web", 0.7)
    assert parse_stream_spec("s3://bucket/data/web") == ("s3://bucket/data/web", 1.0)
    assert parse_stream_spec("/data/code:3") == ("/data/code", 3.0)
    assert parse_stream_spec("file:///data/code") == ("file:///data/code", 1.0)
    with pytest.raises(ConfigError, match="weight"):
        parse_stream_spec("/data/code:0")
    with pytest.raises(ConfigError, match="empty"):
        parse_stream_spec(":2")
    with pytest.raises(ConfigError, match="not both"):
        ZephonDataLoader.Config(dataset_path="/a", streams=["/b"])
    with pytest.raises(ConfigError, match="dataset_path"):
        ZephonDataLoader.Config()


def test_mixture_from_weighted_stream_specs(small_bpe_dataset, stdlib_corpus, bpe_tokenizer_json, tmp_path):
    from zephon_stream import write_dataset

    other = tmp_path / "other"
    write_dataset(
        [str(p) for p in stdlib_corpus.files[40:60]],
        str(other),
        tokenizer=f"hf:{bpe_tokenizer_json}",
        block_tokens=4097,
        blocks_per_shard=4,
        progress=False,
    )
    config = ZephonDataLoader.Config(streams=[f"{small_bpe_dataset.url}:3", f"{other}:1"], seed=2)
    with build(config, seq_len=32, local_batch_size=8) as loader:
        take(loader, 4)
        state = json.loads(loader.state_dict()[STATE_KEY])
        progress = loader.streaming_loader.progress()
    assert [float(w) for w in state["weights"]] == [3.0, 1.0]
    assert state["lane_counts"] == [6, 2]
    assert [p["samples"] for p in progress] == [24, 8]


def test_finite_run_ends_with_dataloader_exhausted(small_bpe_dataset):
    config = ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url, max_steps=5)
    with build(config, seq_len=32, local_batch_size=4) as loader:
        batches = iter(loader)
        for _ in range(3):
            next(batches)
        state = loader.state_dict()
    # Resumed at another dp degree, the run still ends after step 5.
    halves = [build(config, dp_world_size=2, dp_rank=r, seq_len=32, local_batch_size=2) for r in range(2)]
    for half in halves:
        half.load_state_dict(state)
        batches = iter(half)
        next(batches), next(batches)
        with pytest.raises(DataloaderExhaustedError, match="5 steps"):
            next(batches)
        half.close()


def test_one_pass_as_torchtitans_validator_asks_for_it(small_bpe_dataset):
    """TorchTitan's validator rebuilds its loader with ``replace(config,
    infinite=...)`` (main: ``repeat=...``) and stops on ``StopIteration``; a
    plain loop must end too."""
    seq_len, rows = 256, 4
    samples_per_pass = sum((int(n) - 1) // seq_len for n in small_bpe_dataset.manifest.block_token_counts())
    config = dataclasses.replace(ZephonDataLoader.Config(dataset_path=small_bpe_dataset.url), **repeat(False))
    with build(config, seq_len=seq_len, local_batch_size=rows) as loader:
        positions = []
        for _ in loader:
            positions.extend(loader.last_sample_positions.tolist())
        with pytest.raises(StopIteration):
            next(loader)
        with pytest.raises(DataloaderExhaustedError):
            next(loader)
    # The pass is cut into `rows` lanes (the first global batch); the
    # remainder of the epoch, fewer than `rows` samples, is not read.
    assert positions == list(range(samples_per_pass // rows * rows))


def test_config_repr_and_logged_dict_hide_storage_secrets():
    options = {
        "key": "AKIAEXAMPLE1234",
        "secret": "hunter2-secret",
        "client_kwargs": {"endpoint_url": "http://s3:9000"},
    }
    config = ZephonDataLoader.Config(dataset_path="s3://b/d", storage_options=options)
    # TorchTitan's trainer logs json.dumps(config.to_dict()) and saves it.
    for text in (repr(config), json.dumps(config.to_dict())):
        assert "AKIAEXAMPLE1234" not in text and "hunter2-secret" not in text
        assert "http://s3:9000" in text
    assert config.storage_options == options


def job_config_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, loader_config: str):
    """TorchTitan's own ConfigManager over a job module (written to ``tmp_path``)
    whose dataloader is ``loader_config``, a ``ZephonDataLoader.Config(...)``
    expression; returns ``parse(*command_line_overrides)``."""
    job = textwrap.dedent(
        """
        from dataclasses import dataclass, field
        from zephon_stream.integrations.torchtitan import BaseDataLoader, ZephonDataLoader

        @dataclass(kw_only=True, slots=True)
        class Job:
            hf_assets_path: str = "."
            dataloader: BaseDataLoader.Config = field(default_factory=BaseDataLoader.Config)

        def job():
            return Job(dataloader=LOADER_CONFIG)
        """
    )
    (tmp_path / f"{module}.py").write_text(job.replace("LOADER_CONFIG", loader_config))
    monkeypatch.syspath_prepend(str(tmp_path))
    from torchtitan.config import ConfigManager

    return lambda *overrides: ConfigManager().parse_args(["--module", module, "--config", "job", *overrides])


def test_torchtitan_config_manager_parses_the_loader_config(tmp_path, monkeypatch):
    """TorchTitan's own ConfigManager (tyro) reads our Config from a job
    function and applies command-line overrides to it."""
    parse = job_config_parser(
        tmp_path, monkeypatch, "zephon_job_config", 'ZephonDataLoader.Config(dataset_path="s3://bucket/web")'
    )
    config = parse(
        "--dataloader.seed",
        "9",
        "--dataloader.dataset_path",
        "None",
        "--dataloader.streams",
        "s3://bucket/web:0.7,s3://bucket/code:0.3",
    )
    loader_config = config.dataloader
    assert isinstance(loader_config, ZephonDataLoader.Config)
    assert loader_config.dataset_path is None
    assert loader_config.streams == ["s3://bucket/web:0.7", "s3://bucket/code:0.3"]
    assert (loader_config.seed, loader_config.prefetch_steps) == (9, 4)


class _BlockTorchTitan(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchtitan" or name.startswith("torchtitan."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_missing_torchtitan_says_how_to_install(monkeypatch):
    for name in [n for n in sys.modules if n == "torchtitan" or n.startswith("torchtitan.")]:
        monkeypatch.delitem(sys.modules, name)
    # The integration is split over several modules; import it afresh,
    # as a user without TorchTitan would, not from this session's cache.
    for name in [n for n in sys.modules if n.startswith("zephon_stream.integrations.torchtitan")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_BlockTorchTitan(), *sys.meta_path])
    with pytest.raises(ImportError, match=re.escape("pip install 'zephon-stream[torchtitan]'")):
        importlib.import_module("zephon_stream.integrations.torchtitan")


def test_only_the_integration_seam_imports_torchtitan():
    """One module imports TorchTitan (with the install hint) and tells its two
    data APIs apart; the others ask it (``titan_module``, ``TITAN``)."""
    importers = [
        path.relative_to(REPO).as_posix()
        for path in sorted((REPO / "zephon_stream").rglob("*.py"))
        if re.search(
            r"^\s*(from|import)\s+torchtitan\b|import_module\(\s*[\"']torchtitan|\bimport_module\(name\)",
            path.read_text(encoding="utf-8"),
            re.MULTILINE,
        )
    ]
    assert importers == ["zephon_stream/integrations/torchtitan/api.py"]
    askers = [
        path.name
        for path in sorted((REPO / "zephon_stream" / "integrations" / "torchtitan").glob("*.py"))
        if "titan_module(" in path.read_text(encoding="utf-8")
    ]
    assert askers == ["api.py", "torchft.py", "torchft_trainer.py"]
    # Which API it is, and every name that differs, is said in api.py alone.
    for path in sorted((REPO / "zephon_stream" / "integrations").rglob("*.py")):
        if path.name != "api.py":
            text = path.read_text(encoding="utf-8")
            for name in (
                "components.dataloader",
                "components.data.loader",
                "num_pp_microbatches",
                "num_pipeline_parallel_microbatches",
                "config.infinite",
                "config.repeat",
                "self.infinite",
                "self.repeat",
            ):
                assert name not in text, f"{path.relative_to(REPO)} names {name}: ask api.TITAN instead"


def test_the_api_found_is_the_installed_torchtitans():
    """``TITAN`` says main exactly where TorchTitan has main's data package,
    and a run against main (ZEPHON_EXPECT_TORCHTITAN=main) gets main."""
    has_data_package = importlib.util.find_spec("torchtitan.components.data") is not None
    assert TITAN.name == ("main" if has_data_package else "0.3.0")
    assert TITAN.flat_batches == has_data_package
    expected = os.environ.get("ZEPHON_EXPECT_TORCHTITAN")
    if expected:
        assert TITAN.name == expected


# -- real ranks under torchrun -------------------------------------------------------


def torchrun(script: str, nproc: int, *args: str, env: dict[str, str] | None = None) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(WORKERS / script),
        *args,
    ]
    # The session's own path first: under tests/test_torchtitan_main.py it puts TorchTitan main there.
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)
    full_env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    # torchrun leaves a torchelastic_* folder in its TMPDIR, and ranks
    # killed their node cache's files: both in a folder that is removed.
    with tempfile.TemporaryDirectory(prefix="zs-torchrun-") as tmp:
        run_env = {**full_env, "TMPDIR": tmp, "ZEPHON_NODE_CACHE": os.path.join(tmp, "node-cache")}
        out = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, f"{script} x{nproc} failed:\n{out.stdout[-4000:]}\n{out.stderr[-6000:]}"


def dataloader_entries(base_folder: Path, step: int) -> list[str]:
    """The ``dataloader.*`` keys of a checkpoint TorchTitan's manager wrote."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(base_folder / "checkpoint" / f"step-{step}")).read_metadata()
    return sorted(key for key in metadata.state_dict_metadata if key.startswith("dataloader"))


def step_hashes(out_dir: Path) -> dict[int, str]:
    """Per step: sha256 over the union of every rank's rows, ordered by global position."""
    rows: dict[int, list] = {}
    for path in sorted(out_dir.glob("rank*.json")):
        for step, step_rows in json.loads(path.read_text())["steps"].items():
            rows.setdefault(int(step), []).extend(step_rows)
    return {step: _hash_rows(step_rows) for step, step_rows in rows.items()}


@pytest.mark.slow
@pytest.mark.torchrun
def test_titan_checkpoint_at_dp4_resumes_at_dp2_and_dp3_bit_identically(
    small_bpe_dataset, titan_tokenizer_dir, s3_bucket, tmp_path
):
    from zephon_stream import write_dataset

    url = s3_bucket.url("bpe")
    write_dataset(
        list(map(str, small_bpe_dataset.sources)),
        url,
        tokenizer=small_bpe_dataset.tokenizer,
        block_tokens=4097,
        blocks_per_shard=4,
        progress=False,
    )
    seq_len, global_batch = 256, 12
    manifest = small_bpe_dataset.manifest
    samples_per_pass = sum((int(n) - 1) // seq_len for n in manifest.block_token_counts())
    # Save a few steps before the end of the first epoch so the resumed
    # steps cross the epoch boundary (and the save lands mid-block).
    save_step = samples_per_pass // global_batch - 3
    steps_after = 8
    corpus = tmp_path / "corpus.jsonl"  # TorchTitan main's own loader reads JSONL
    corpus.write_text("".join(json.dumps({"text": p.read_text()}) + "\n" for p in small_bpe_dataset.sources))
    common = [
        "--dataset",
        url,
        "--tokenizer-dir",
        str(titan_tokenizer_dir),
        "--seq-len",
        str(seq_len),
        "--global-batch",
        str(global_batch),
        "--seed",
        "4",
        "--save-step",
        str(save_step),
        "--ckpt",
        str(tmp_path / "ckpt"),
        "--titan-ckpt",
        str(tmp_path / "titan_ckpt"),
        "--titan-corpus",
        str(corpus),
    ]
    runs = {"dp4": (4, "save"), "dp2": (2, "resume"), "dp3": (3, "resume")}
    for name, (nproc, mode) in runs.items():
        out = tmp_path / name
        out.mkdir()
        torchrun(
            "resume_worker.py",
            nproc,
            *common,
            "--mode",
            mode,
            "--steps",
            str(steps_after),
            "--out",
            str(out),
            env=s3_bucket.env,
        )

    expected = reference_hashes(
        ZephonDataLoader.Config(dataset_path=url, seed=4),
        seq_len=seq_len,
        global_batch=global_batch,
        num_steps=save_step + steps_after,
    )
    saved = step_hashes(tmp_path / "dp4")
    assert sorted(saved) == list(range(save_step))
    assert all(saved[step] == expected[step] for step in saved), "dp=4 before the save differs from dp=1"
    for name in ("dp2", "dp3"):
        resumed = step_hashes(tmp_path / name)
        assert sorted(resumed) == list(range(save_step, save_step + steps_after))
        mismatched = [step for step in resumed if resumed[step] != expected[step]]
        assert not mismatched, f"{name}: steps {mismatched} differ from the uninterrupted run"
    last_position = max(
        row[0]
        for path in (tmp_path / "dp2").glob("rank*.json")
        for rows in json.loads(path.read_text())["steps"].values()
        for row in rows
    )
    assert last_position >= samples_per_pass, "the resumed steps should cross the epoch boundary"

    # One dataloader entry for all ranks; TorchTitan's own loader writes one per rank.
    assert dataloader_entries(tmp_path / "ckpt", save_step) == ["dataloader.zephon"]
    titan_entries = {".".join(key.split(".")[:2]) for key in dataloader_entries(tmp_path / "titan_ckpt", save_step)}
    assert sorted(titan_entries) == titan_own_entries(4)

    # The same flow with TorchTitan's own loader stops at the load.
    error_type, message = TITAN_OWN_REFUSAL
    for name in ("dp2", "dp3"):
        for path in sorted((tmp_path / name).glob("rank*.json")):
            error = json.loads(path.read_text())["titan_error"]
            assert error is not None and error[0] == error_type, (name, error)
            assert message in error[1]


@pytest.mark.slow
@pytest.mark.torchrun
def test_training_losses_after_dp2_to_dp1_resume_match_the_uninterrupted_run(small_bpe_dataset, tmp_path):
    """Two DDP ranks train a tiny transformer, checkpoint through TorchTitan's
    manager at step 3 and go on to step 6; one rank resumes from step 3 with
    the same global batch. Changing dp changes the order of the gradient and
    loss reductions, so the losses agree to float tolerance, not bit for bit."""
    vocab_size = small_bpe_dataset.manifest.tokenizer.vocab_size
    common = [
        "--dataset",
        small_bpe_dataset.url,
        "--vocab-size",
        str(vocab_size),
        "--seq-len",
        "32",
        "--global-batch",
        "8",
        "--ckpt",
        str(tmp_path / "ckpt"),
        "--save-step",
        "3",
        "--total-steps",
        "6",
    ]
    torchrun("train_worker.py", 2, *common, "--out", str(tmp_path / "dp2.json"))
    torchrun("train_worker.py", 1, *common, "--resume", "--out", str(tmp_path / "dp1.json"))
    uninterrupted = json.loads((tmp_path / "dp2.json").read_text())["losses"]
    resumed = json.loads((tmp_path / "dp1.json").read_text())["losses"]
    assert sorted(resumed, key=int) == ["4", "5", "6"]
    assert uninterrupted["1"] != uninterrupted["6"], "the model should be learning"
    for step, loss in resumed.items():
        assert loss == pytest.approx(uninterrupted[step], rel=1e-5), f"step {step}"


def test_example_job_configs_select_the_zephon_loader(tmp_path):
    """The example's job configs build on the installed TorchTitan, in a process
    of their own (TorchTitan's models need triton: check_job.py stands in for
    its one triton module where it is missing)."""
    check = textwrap.dedent(
        """
        import check_job
        check_job.stand_in_for_triton_kernels()
        import zephon_titan
        from zephon_stream.integrations.torchtitan import TITAN, ZephonDataLoader
        for make_config in (zephon_titan.llama3_debugmodel_zephon, zephon_titan.llama3_8b_zephon):
            config = make_config()
            assert isinstance(config.dataloader, ZephonDataLoader.Config), type(config.dataloader)
            assert config.dataloader.dataset_path == "s3://bucket/zephon/web"
            assert config.validator.enable is False
        keywords = TITAN.loader_keywords(zephon_titan.llama3_debugmodel_zephon().training)
        print(sorted(keywords.items()))
        """
    )
    path = os.pathsep.join(
        p for p in (str(REPO / "examples" / "torchtitan"), os.environ.get("PYTHONPATH"), str(REPO)) if p
    )
    done = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": path, "ZEPHON_DATASET": "s3://bucket/zephon/web", "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # 8 rows of 512 tokens a rank, in the installed TorchTitan's names.
    want = (
        [("max_context_length", 512), ("num_tokens_per_batch", 4096)]
        if TITAN.flat_batches
        else [("local_batch_size", 8), ("seq_len", 512)]
    )
    assert done.stdout.strip().splitlines()[-1] == repr(want)
