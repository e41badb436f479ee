"""Secrets across a full run: keys given as storage options, in a URL and in
the environment, through a write + load + fault run in this process and in CLI
subprocesses; every captured output is searched for them.

The S3 server (moto) accepts any credentials, so the run uses unique values
that cannot appear anywhere by chance.
"""

from __future__ import annotations

import io
import logging
import shutil
import subprocess
import sys
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from tools.fault_proxy import FaultProxy
from tools.reliability.chaos import mixed_rates
from tools.reliability.common import check, child_env, step_hashes

OPTION_KEY = "AKIAZSRELIABILITYOPT1"
OPTION_SECRET = "zsRel/OptionSecret+Value=91"
URL_KEY = "AKIAZSRELIABILITYURL2"
URL_SECRET = "zsRelUrlSecretValue82"
ENV_KEY = "AKIAZSRELIABILITYENV3"
ENV_SECRET = "zsRel/EnvSecret+Value=73"
CLI_KEY = "AKIAZSRELIABILITYCLI4"
CLI_SECRET = "zsRel/CliSecret+Value=64"
SECRETS = (OPTION_KEY, OPTION_SECRET, URL_KEY, URL_SECRET, ENV_KEY, ENV_SECRET, CLI_KEY, CLI_SECRET)


def _cli(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "zephon_stream", *args], env=env, capture_output=True, text=True, timeout=600
    )
    # The command line itself holds the secrets; only what the program printed is searched.
    return f"$ zephon-stream {args[0]} [exit {done.returncode}]\n{done.stdout}\n{done.stderr}"


def secrets_run(*, endpoint_url: str, bucket: str, inputs: list[Path], work: Path, steps: int = 40) -> dict[str, Any]:
    """Write, load, fail and print with secrets everywhere; search every output.

    Returns:
        ``{"outputs_searched", "chars_searched", "errors_seen", "leaks": []}``.

    Raises:
        ScenarioFailure: a secret appears in any captured output.
    """
    from zephon_stream import StreamingLoader, write_dataset
    from zephon_stream.errors import ZephonError
    from zephon_stream.reader import DatasetReader
    from zephon_stream.reader.verify import verify_dataset

    log = io.StringIO()
    handler = logging.StreamHandler(log)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    library_logger = logging.getLogger("zephon_stream")
    saved_level = library_logger.level
    library_logger.setLevel(logging.DEBUG)
    root_logger = logging.getLogger()
    root_logger.addHandler(handler)
    seen: list[str] = []
    errors = 0
    out, err = io.StringIO(), io.StringIO()
    try:
        with (
            redirect_stdout(out),
            redirect_stderr(err),
            warnings.catch_warnings(record=True) as caught,
            FaultProxy(upstream=endpoint_url, rates=mixed_rates(0.2), seed=77, stall_s=0.2, slow_body_s=0.1) as proxy,
        ):
            warnings.simplefilter("always")
            options = {
                "key": OPTION_KEY,
                "secret": OPTION_SECRET,
                "endpoint_url": proxy.endpoint_url,
                "client_kwargs": {"region_name": "us-east-1"},
            }
            url = f"s3://{bucket}/secrets-ds"
            summary = write_dataset(
                [str(p) for p in inputs],
                url,
                tokenizer="bytes",
                block_tokens=4097,
                blocks_per_shard=4,
                storage_options=options,
                progress=True,
            )
            seen += [repr(summary), summary.table()]
            with StreamingLoader(url, seq_len=256, local_batch_size=8, storage_options=options) as loader:
                seen += [repr(loader), repr(loader.manifests), repr(loader.stats()), repr(loader.state_dict())]
                step_hashes(loader, steps)
                seen += [repr(loader.stats())]
            with DatasetReader.open(url, options) as reader:
                report = verify_dataset(reader)
                seen += [repr(reader), repr(report)]
            # Errors: credentials in a URL, a missing dataset or input, an existing output, a corrupt block.
            failures = [
                lambda: StreamingLoader(
                    f"s3://{URL_KEY}:{URL_SECRET}@{bucket}/secrets-ds",
                    seq_len=256,
                    local_batch_size=8,
                    storage_options=options,
                ),
                lambda: StreamingLoader(
                    f"s3://{bucket}/no-such-ds", seq_len=256, local_batch_size=8, storage_options=options
                ),
                lambda: write_dataset(
                    [f"s3://{bucket}/no-such-input/*.txt"],
                    f"s3://{bucket}/x",
                    tokenizer="bytes",
                    storage_options=options,
                ),
                lambda: write_dataset([str(p) for p in inputs], url, tokenizer="bytes", storage_options=options),
            ]
            for fail in failures:
                try:
                    fail()
                except ZephonError as exc:
                    errors += 1
                    seen += [str(exc), repr(exc)]
            from zephon_stream.storage import open_store

            with open_store(url, options) as store:
                manifest_bytes = store.read("manifest")
                shard = sorted(p for p in store.list("shards/") if p.endswith(".zst"))[0]
                data = bytearray(store.read(shard))
                data[len(data) // 2] ^= 0x10
                store.write_atomic(shard, bytes(data))
            with StreamingLoader(url, seq_len=256, local_batch_size=8, storage_options=options) as broken:
                try:
                    step_hashes(broken, 10_000)
                except ZephonError as exc:
                    errors += 1
                    seen += [str(exc), repr(exc)]
            seen += [str(w.message) for w in caught]
            seen += [repr(proxy.counts()), manifest_bytes.decode("latin-1")]
    finally:
        root_logger.removeHandler(handler)
        library_logger.setLevel(saved_level)
    seen += [out.getvalue(), err.getvalue(), log.getvalue()]

    # Subprocesses: the CLI with keys as --storage-option and keys in the environment.
    env = child_env(
        {
            "AWS_ENDPOINT_URL": endpoint_url,
            "AWS_ACCESS_KEY_ID": ENV_KEY,
            "AWS_SECRET_ACCESS_KEY": ENV_SECRET,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    folder = work / "cli-inputs"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for path in inputs:
        shutil.copy(path, folder / path.name)
    options_args = ["--storage-option", f"key={CLI_KEY}", "--storage-option", f"secret={CLI_SECRET}"]
    seen += [
        _cli(
            [
                "write",
                str(folder / "*.py"),
                "--output",
                f"s3://{bucket}/cli-ds",
                "--tokenizer",
                "bytes",
                "--block-tokens",
                "4097",
                *options_args,
                "--json",
            ],
            env,
        ),
        _cli(["inspect", f"s3://{bucket}/cli-ds"], env),
        _cli(["verify", f"s3://{bucket}/cli-ds"], env),
        _cli(["verify", f"s3://{bucket}/secrets-ds"], env),  # the corrupt one: exit 1, lists the shard
        _cli(["inspect", f"s3://{ENV_KEY}:{ENV_SECRET}@{bucket}/no-such-ds"], env),
        _cli(
            [
                "write",
                str(folder / "*.py"),
                "--output",
                f"s3://{bucket}/cli-ds",
                "--tokenizer",
                "bytes",
                "--storage-option",
                f"secret:{CLI_SECRET}",
            ],
            env,
        ),
    ]
    text = "\n".join(seen)
    check("CORRUPT" in text and "no committed dataset" in text, "the failing commands did not report their errors")
    leaks = [secret for secret in SECRETS if secret in text]
    check(not leaks, f"secrets leaked into captured output: {leaks}")
    return {"outputs_searched": len(seen), "chars_searched": len(text), "errors_seen": errors, "leaks": leaks}
