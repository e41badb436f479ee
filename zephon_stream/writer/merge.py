"""Join parts written by separate ranks into one dataset, shards untouched.

A part is a complete dataset in a folder below the output root (as
``write`` under a launcher leaves them: ``OUTPUT/part-00000-of-00003/``).
The merged manifest lists every part's shards and document-index sidecars in
part order, by their paths relative to the output root, so nothing but the
manifest and the rejects list is written. Its totals and fingerprint are
derived by the same rules as any other manifest (``Manifest.create``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from zephon_stream.errors import ConfigError, ManifestError, ObjectMissingError, PathEscapeError
from zephon_stream.format.manifest import Manifest
from zephon_stream.format.spec import MANIFEST_NAME, REJECTS_NAME
from zephon_stream.storage import Store, check_relative_path, is_local_url, local_path, open_store
from zephon_stream.writer.distributed import PART_PREFIX, parse_part_name
from zephon_stream.writer.empty import refuse_empty


def part_path_under(output: str, part: str) -> str:
    """The path of ``part`` relative to ``output``, which must contain it.

    Args:
        output: the merged dataset's root (local folder or URL).
        part: a part's root (local folder or URL), or a path relative to ``output``.

    Raises:
        PathEscapeError: the part is not strictly below the output root, so
            the merged manifest could not name its shards without ``..``.
    """

    def refuse(reason: str) -> PathEscapeError:
        return PathEscapeError(
            f"part {part} is not inside the output {output}: {reason}; a merged manifest names "
            "its parts' shards by relative paths, so write the parts below the output root "
            "(e.g. OUTPUT/part-00000-of-00003)"
        )

    output_local, part_local = is_local_url(output), is_local_url(part)
    if part_local and not output_local and not os.path.isabs(local_path(part)):
        try:
            return check_relative_path(part.strip("/"), root=output)
        except PathEscapeError as exc:
            raise refuse(str(exc)) from None
    if output_local != part_local:
        raise refuse("one is a local path and the other a URL")
    if output_local:
        root = os.path.realpath(local_path(output))
        target = local_path(part)
        if not os.path.isabs(target) and not os.path.exists(target):
            target = os.path.join(root, target)
        rel = os.path.relpath(os.path.realpath(target), root).replace(os.sep, "/")
        if rel == "." or rel == ".." or rel.startswith("../"):
            raise refuse("it resolves outside the output folder" if rel != "." else "it is the output itself")
    else:
        root_url, part_url = output.rstrip("/"), part.rstrip("/")
        if not part_url.startswith(root_url + "/"):
            raise refuse("its URL does not start with the output URL")
        rel = part_url[len(root_url) + 1 :]
    try:
        return check_relative_path(rel, root=output)
    except PathEscapeError as exc:
        raise refuse(str(exc)) from None


def find_parts(store: Store) -> list[str]:
    """Part folders (``part-RRRRR-of-WWWWW``) with a committed manifest, in rank order.

    Raises:
        ObjectMissingError: no part at all, or a rank's part is missing or
            uncommitted (a rank that failed or is still running).
        ConfigError: parts from runs with different world sizes.
    """
    committed = {}
    for path in store.list(PART_PREFIX):
        folder, _, name = path.partition("/")
        parsed = parse_part_name(folder)
        if name == MANIFEST_NAME and parsed is not None:
            committed[folder] = parsed
    if not committed:
        raise ObjectMissingError(f"{store.url}: no committed part ({PART_PREFIX}RRRRR-of-WWWWW/{MANIFEST_NAME}) found")
    world_sizes = sorted({world for _, world in committed.values()})
    if len(world_sizes) > 1:
        raise ConfigError(f"{store.url}: parts from runs of different world sizes {world_sizes}; remove the stale ones")
    world_size = world_sizes[0]
    ranks = {rank for rank, _ in committed.values()}
    missing = [rank for rank in range(world_size) if rank not in ranks]
    if missing:
        raise ObjectMissingError(
            f"{store.url}: parts of ranks {missing} of {world_size} have no {MANIFEST_NAME} "
            "(a rank failed or has not finished)"
        )
    return sorted(committed, key=lambda folder: committed[folder][0])


def read_part(store: Store, name: str) -> Manifest:
    """The manifest of the part in folder ``name`` of ``store``, with every entry (either format version)."""
    return Manifest.from_bytes(
        store.read(f"{name}/{MANIFEST_NAME}"),
        where=f"manifest of part {name}",
        read=lambda path: store.read(f"{name}/{path}"),
    )


def _check_compatible(first: Manifest, first_name: str, other: Manifest, name: str) -> None:
    for field in ("dtype", "block_tokens", "blocks_per_shard"):
        mine, theirs = getattr(first, field), getattr(other, field)
        if mine != theirs:
            raise ManifestError(f"part {name}: {field} is {theirs}, but part {first_name} has {mine}")
    if first.tokenizer != other.tokenizer:
        raise ManifestError(
            f"part {name}: tokenizer {other.tokenizer.name or other.tokenizer.kind} "
            f"(fingerprint {other.tokenizer.fingerprint[:16]}) differs from part {first_name}'s "
            f"{first.tokenizer.name or first.tokenizer.kind} (fingerprint {first.tokenizer.fingerprint[:16]})"
        )


def merge_parts(
    parts: Sequence[str],
    output: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    allow_empty: bool = False,
) -> Manifest:
    """Write the manifest of one dataset made of ``parts``, in the order given.

    Args:
        parts: the part roots (URLs or local folders below ``output``, or
            paths relative to it). Empty: every ``part-RRRRR-of-WWWWW``
            folder under ``output``, in rank order, all ranks required.
        output: the merged dataset's root.
        storage_options: fsspec/s3fs options for the output store.
        allow_empty: commit the merge even if no part holds a token (parts
            may be empty one by one: a rank's share can be all rejects).

    Returns:
        The merged, validated manifest (already written).

    Raises:
        PathEscapeError: a part outside the output root.
        ManifestError: parts written with different tokenizers or layouts,
            or a source converted by two parts.
        ConfigError: the output already holds a different dataset.
        EmptyDatasetError: no part holds a token, without ``allow_empty``
            (the merged ``rejects.jsonl`` is written, the manifest is not).
    """
    store = open_store(output, storage_options)
    try:
        names = [part_path_under(output, part) for part in parts] if parts else find_parts(store)
        if len(set(names)) != len(names):
            raise ConfigError(f"merge: a part is listed twice in {names}")
        manifests = [read_part(store, name) for name in names]
        shards, sources, rejects = [], [], []
        source_part: dict[str, str] = {}
        for name, manifest in zip(names, manifests):
            _check_compatible(manifests[0], names[0], manifest, name)
            for source in manifest.sources:
                if source.path in source_part:
                    raise ManifestError(
                        f"source {source.path} was converted by both part {source_part[source.path]} and part {name}"
                    )
                source_part[source.path] = name
            sources.extend(manifest.sources)
            shards.extend(
                dataclasses.replace(s, path=f"{name}/{s.path}", index_path=f"{name}/{s.index_path}")
                for s in manifest.shards
            )
            if manifest.num_rejected or store.exists(f"{name}/{manifest.rejects_path}"):
                rejects.append(store.read(f"{name}/{manifest.rejects_path}"))
        merged = Manifest.create(
            tokenizer=manifests[0].tokenizer,
            block_tokens=manifests[0].block_tokens,
            blocks_per_shard=manifests[0].blocks_per_shard,
            shards=shards,
            sources=sources,
            rejects_path=REJECTS_NAME,
        )
        data = merged.to_bytes()
        if store.exists(MANIFEST_NAME):
            existing = store.read(MANIFEST_NAME)
            if existing == data:
                return merged
            raise ConfigError(
                f"{store.url} already holds a committed dataset (its {MANIFEST_NAME} differs from the merge of "
                f"{len(names)} parts, fingerprint {merged.fingerprint[:16]}); delete {MANIFEST_NAME} to replace it"
            )
        store.write_atomic(
            REJECTS_NAME, b"".join(chunk if chunk.endswith(b"\n") or not chunk else chunk + b"\n" for chunk in rejects)
        )
        if not merged.num_tokens:
            refuse_empty(
                output=store.url,
                num_tokens=0,
                allow_empty=allow_empty,
                what="merge",
                records_in=sum(s.num_records for s in sources),
                num_inputs=len(sources),
                rejected=_reasons(rejects),
                rejects_path=REJECTS_NAME,
            )
        # The manifest is written last: its presence commits the merged dataset.
        merged.write(store)
        return merged
    finally:
        store.close()


def _reasons(rejects: list[bytes]) -> Counter[str]:
    """Rejected records per reason, from the parts' rejects lists (for a message)."""
    reasons: Counter[str] = Counter()
    for chunk in rejects:
        for line in chunk.splitlines():
            if not line.strip():
                continue
            try:
                reasons[str(json.loads(line)["reason"])] += 1
            except (ValueError, KeyError, TypeError):
                reasons["unreadable"] += 1
    return reasons
