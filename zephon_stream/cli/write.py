"""``zephon-stream write``: convert raw text, or token ids, into a dataset."""

from __future__ import annotations

import argparse
import json
import sys

from zephon_stream.format.spec import DEFAULT_BLOCK_TOKENS, DEFAULT_ZSTD_LEVEL, MAX_BLOCK_TOKENS, MIN_BLOCK_TOKENS
from zephon_stream.writer.config import DEFAULT_POOL_MIN_INPUT_BYTES, DEFAULT_UNIT_BYTES


def register(subparsers: argparse._SubParsersAction) -> None:
    from zephon_stream.cli import bounded_int

    positive = bounded_int(1)
    parser = subparsers.add_parser(
        "write",
        help="tokenize raw text (txt, jsonl, .gz/.zst, parquet), or take token ids, into zstd token shards",
        description=(
            "Tokenize raw text into fixed-size zstd token shards with a manifest. Inputs are "
            "paths, folders, globs (** included) or object-store URLs and globs (s3://, gs://, az:// or abfs://); "
            "each pattern's matches are sorted. S3 credentials and endpoint come from the standard AWS variables "
            "(AWS_ENDPOINT_URL included), GCS's and Azure's from theirs (GOOGLE_APPLICATION_CREDENTIALS, "
            "AZURE_STORAGE_*; docs/STORAGE.md), or from --storage-option. With --input-format tokens the inputs "
            "already hold ids of --tokenizer: .npy, raw .bin (--token-dtype), Megatron PREFIX.bin+.idx "
            "(or PREFIX alone), Parquet/JSONL lists of ids (--tokens-field), or a datasets.save_to_disk folder."
        ),
    )
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="input file, folder, glob, or store URL or glob (s3://, gs://, az://)",
    )
    parser.add_argument(
        "--output", "-o", required=True, metavar="URL", help="local folder or store prefix (s3://, gs://, az://)"
    )
    parser.add_argument(
        "--tokenizer", required=True, metavar="SPEC", help="bytes | hf:PATH_OR_URL | tiktoken:NAME_OR_PATH"
    )
    parser.add_argument("--text-field", default="text", metavar="F", help="JSONL key / parquet column (default: text)")
    parser.add_argument("--lines", action="store_true", help="in text files, each line is a document")
    parser.add_argument(
        "--input-format",
        choices=("txt", "jsonl", "parquet", "tokens"),
        help="read every input as this format; tokens: the inputs hold token ids (kind from the file name)",
    )
    parser.add_argument(
        "--tokens-field", default="input_ids", metavar="F", help="token inputs: Parquet/JSONL/datasets column of ids"
    )
    parser.add_argument(
        "--token-dtype", choices=("uint16", "uint32"), help="token inputs: dtype of raw .bin arrays (no header)"
    )
    parser.add_argument(
        "--append-eos",
        action="store_true",
        help="token inputs: end each document that lacks the EOS id with one (without it, such a document is rejected)",
    )
    parser.add_argument(
        "--workers",
        type=positive,
        default=1,
        metavar="N",
        help="tokenizer processes (default: 1, in this process); with token inputs, compression threads",
    )
    parser.add_argument(
        "--pool-min-input-bytes",
        type=bounded_int(0),
        default=DEFAULT_POOL_MIN_INPUT_BYTES,
        metavar="N",
        help="uncompressed local text inputs under N bytes in all (and the bytes tokenizer) tokenize in "
        "this process whatever --workers says (default: 4 MiB; 0: always start the workers)",
    )
    parser.add_argument(
        "--block-tokens",
        type=bounded_int(MIN_BLOCK_TOKENS, MAX_BLOCK_TOKENS),
        default=DEFAULT_BLOCK_TOKENS,
        metavar="N",
        help="tokens per block (default: 2**20+1)",
    )
    parser.add_argument(
        "--blocks-per-shard", type=positive, metavar="N", help="blocks per shard (default: ~64 Mi tokens a shard)"
    )
    parser.add_argument(
        "--zstd-level", type=bounded_int(1, 22), default=DEFAULT_ZSTD_LEVEL, metavar="L", help="zstd level (default: 3)"
    )
    parser.add_argument("--eos-token", metavar="TOK", help="end-of-document token (default: found by name)")
    parser.add_argument("--bos-token", metavar="TOK", help="start-of-document token (default: none)")
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for inputs and output (s3fs, gcsfs, adlfs; repeatable)",
    )
    parser.add_argument(
        "--engine",
        choices=("pool", "ray"),
        default="pool",
        help="pool: this process and --workers tokenizer processes (default); ray: work units as Ray tasks",
    )
    parser.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="--engine ray: the cluster to join (HOST:PORT, ray://HOST:PORT or auto; default: a local instance)",
    )
    parser.add_argument(
        "--ray-workers",
        type=positive,
        metavar="N",
        help="--engine ray: units converted at once (default: the cluster's CPUs)",
    )
    parser.add_argument(
        "--unit-bytes",
        type=positive,
        default=DEFAULT_UNIT_BYTES,
        metavar="N",
        help="--engine ray: stored input bytes a work unit aims at (default: 64 MiB)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a dataset already at --output")
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="commit a dataset that holds no tokens (every record rejected, or none); without it such a run "
        "exits 1 with rejects.jsonl written and no manifest. Under a launcher a rank's part is committed "
        "even if empty: `merge` judges the whole",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from zephon_stream.storage import parse_storage_options
    from zephon_stream.writer.api import write_dataset
    from zephon_stream.writer.distributed import assign_rank_work

    inputs, output = args.inputs, args.output
    options = parse_storage_options(args.storage_option) or None
    expand = None
    if args.input_format == "tokens":
        from zephon_stream.writer.token_inputs import token_input_urls

        # A rank's share must keep X.bin with X.idx and a datasets folder whole.
        expand = token_input_urls
    # Under a launcher (RANK/WORLD_SIZE, Slurm) each rank writes its share as OUTPUT/part-*; see `merge`.
    share = None if args.engine == "ray" else assign_rank_work(inputs, output, storage_options=options, expand=expand)
    allow_empty = args.allow_empty
    if share is not None:
        inputs, output = share.inputs, share.output
        # One rank's share may be all rejects while the others hold
        # tokens; whether the dataset is empty is decided at the merge.
        allow_empty = True
        print(
            f"rank {share.rank.rank} of {share.rank.world_size}: {len(inputs)} of "
            f"{share.num_inputs_total} inputs -> {output}",
            file=sys.stderr,
        )
    summary = write_dataset(
        inputs,
        output,
        tokenizer=args.tokenizer,
        text_field=args.text_field,
        lines=args.lines,
        workers=args.workers,
        block_tokens=args.block_tokens,
        blocks_per_shard=args.blocks_per_shard,
        storage_options=options,
        progress=False if args.no_progress else None,
        eos_token=args.eos_token,
        bos_token=args.bos_token,
        input_format=args.input_format,
        zstd_level=args.zstd_level,
        overwrite=args.overwrite,
        tokens_field=args.tokens_field,
        token_dtype=args.token_dtype,
        append_eos=args.append_eos,
        pool_min_input_bytes=args.pool_min_input_bytes,
        allow_empty=allow_empty,
        engine=args.engine,
        ray_address=args.ray_address,
        ray_workers=args.ray_workers,
        unit_bytes=args.unit_bytes,
    )
    if args.json:
        print(json.dumps(summary.to_dict()))
    else:
        print(summary.table())
    if summary.num_rejected:
        print(f"{summary.num_rejected} records rejected; see rejects.jsonl in the output", file=sys.stderr)
    return 0
