"""The rule every commit path keeps: no tokens, no manifest, unless asked.

A dataset whose inputs were all rejected (or empty) cannot be read: any
loader over it has no sample. Committing it with status 0 hides the
problem until a training job opens it, far from the cause, so a writer
(``write_dataset``, ``merge_parts``) refuses instead, keeps the rejects and
names them; ``allow_empty`` commits it all the same (a pipeline step that
may legitimately find nothing).
"""

from __future__ import annotations

from collections.abc import Mapping

from zephon_stream.errors import EmptyDatasetError


def refuse_empty(
    *,
    output: str,
    num_tokens: int,
    allow_empty: bool,
    records_in: int,
    num_inputs: int,
    rejected: Mapping[str, int],
    rejects_path: str,
    what: str = "write",
) -> None:
    """Raise unless the dataset about to be committed holds tokens or an empty one was asked for.

    Args:
        output: the dataset's root URL (for the message).
        num_tokens: tokens the dataset would hold.
        allow_empty: commit an empty dataset all the same.
        records_in: records read from the inputs.
        num_inputs: input files (or parts) read.
        rejected: rejected records per reason.
        rejects_path: where the rejects are listed, relative to ``output``.
        what: the operation, for the message (``write``, ``merge``).

    Raises:
        EmptyDatasetError: no tokens and ``allow_empty`` is false.
    """
    if num_tokens or allow_empty:
        return
    num_rejected = sum(rejected.values())
    inputs = f"{num_inputs} input{'s' if num_inputs != 1 else ''}"
    if records_in == 0:
        found = f"{inputs} held no record"
    else:
        reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(rejected.items()))
        found = (
            f"all {num_rejected} records of {inputs} were rejected ({reasons}), "
            f"listed in {output.rstrip('/')}/{rejects_path}"
        )
    raise EmptyDatasetError(
        f"{what} {output}: no tokens to commit: {found}; no manifest written, so no dataset is there "
        "(pass --allow-empty, or allow_empty=True, to commit an empty dataset)"
    )
