"""What the writer reports: a progress bar while it runs, a summary when done."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROGRESS_REFRESH_S = 0.5


def name_value_table(rows: list[tuple[str, str]], *, indent: str = "") -> str:
    """``(name, value)`` rows as lines, the values aligned after the longest name."""
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{indent}{name:<{width}}  {value}" for name, value in rows)


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteSummary:
    """The accounting of one ``write_dataset`` run.

    ``records_in == records_written + sum(rejected.values())`` always holds.
    ``tokenizer_processes`` counts the worker processes that tokenized (0:
    this process did, as for token inputs, ``workers=1``, the ``bytes``
    tokenizer and small inputs). A run on Ray (``engine="ray"``) counts its
    work units in ``num_units``, and in ``units_reused`` those a rerun found
    complete and did not convert again.
    """

    output: str
    records_in: int
    records_written: int
    rejected: dict[str, int] = field(default_factory=dict)
    num_documents: int
    num_tokens: int
    num_shards: int
    num_blocks: int
    compressed_bytes: int
    input_bytes: int
    seconds: float
    fingerprint: str
    tokenizer_processes: int = 0
    num_units: int = 0
    units_reused: int = 0

    @classmethod
    def of(cls, manifest: Any, *, rejected: Mapping[str, int], **accounting: Any) -> WriteSummary:
        """The summary of a run that committed ``manifest``: its totals, and the run's ``accounting``."""
        return cls(
            rejected=dict(sorted(rejected.items())),
            num_documents=manifest.num_documents,
            num_tokens=manifest.num_tokens,
            num_shards=manifest.num_shards,
            num_blocks=manifest.num_blocks,
            compressed_bytes=manifest.compressed_bytes,
            fingerprint=manifest.fingerprint,
            **accounting,
        )

    @property
    def num_rejected(self) -> int:
        return sum(self.rejected.values())

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_token(self) -> float:
        return self.compressed_bytes / self.num_tokens if self.num_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain values, for JSON."""
        return {
            "output": self.output,
            "records_in": self.records_in,
            "records_written": self.records_written,
            "rejected": dict(self.rejected),
            "num_rejected": self.num_rejected,
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "num_shards": self.num_shards,
            "num_blocks": self.num_blocks,
            "compressed_bytes": self.compressed_bytes,
            "input_bytes": self.input_bytes,
            "bytes_per_token": self.bytes_per_token,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens_per_s,
            "fingerprint": self.fingerprint,
            "tokenizer_processes": self.tokenizer_processes,
            "num_units": self.num_units,
            "units_reused": self.units_reused,
        }

    def table(self) -> str:
        """A two-column table for people."""
        rows = [
            ("output", self.output),
            ("records in", f"{self.records_in:,}"),
            ("records written", f"{self.records_written:,}"),
            ("records rejected", f"{self.num_rejected:,}"),
        ]
        rows += [(f"  {reason}", f"{count:,}") for reason, count in sorted(self.rejected.items())]
        rows += [
            ("documents", f"{self.num_documents:,}"),
            ("tokens", f"{self.num_tokens:,}"),
            ("shards", f"{self.num_shards:,}"),
            ("blocks", f"{self.num_blocks:,}"),
            ("input bytes", f"{self.input_bytes:,}"),
            ("compressed bytes", f"{self.compressed_bytes:,}"),
            ("bytes/token", f"{self.bytes_per_token:.3f}"),
            ("tokens/s", f"{self.tokens_per_s:,.0f}"),
            ("seconds", f"{self.seconds:.2f}"),
            ("fingerprint", self.fingerprint),
        ]
        if self.num_units:
            rows[1:1] = [("units", f"{self.num_units:,}"), ("units reused", f"{self.units_reused:,}")]
        return name_value_table(rows)


class Progress:
    """A tqdm bar over input bytes with tokens/s; silent when disabled.

    Args:
        enabled: ``True``/``False``, or ``None`` to show it only on a terminal.
        total_bytes: total stored size of the inputs, when known (gives an ETA).
    """

    def __init__(self, *, enabled: bool | None, total_bytes: int | None) -> None:
        if enabled is None:
            enabled = sys.stderr.isatty()
        self._bar = None
        self._start = time.monotonic()
        self._last_refresh = 0.0
        self._bytes = 0
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_bytes,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc="write",
                dynamic_ncols=True,
                file=sys.stderr,
            )

    def update(self, *, bytes_read: int, tokens: int) -> None:
        """Move to ``bytes_read`` input bytes and ``tokens`` tokens written so far."""
        if self._bar is None:
            return
        if bytes_read > self._bytes:
            self._bar.update(bytes_read - self._bytes)
            self._bytes = bytes_read
        now = time.monotonic()
        if now - self._last_refresh >= PROGRESS_REFRESH_S:
            self._last_refresh = now
            rate = tokens / max(now - self._start, 1e-9)
            self._bar.set_postfix_str(f"{tokens:,} tokens, {rate:,.0f} tokens/s", refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class UnitProgress:
    """A tqdm bar over work units with records, tokens and tokens/s; silent when disabled.

    Args:
        enabled: ``True``/``False``, or ``None`` to show it only on a terminal.
        total_units: units of the run.
    """

    def __init__(self, *, enabled: bool | None, total_units: int) -> None:
        if enabled is None:
            enabled = sys.stderr.isatty()
        self._bar = None
        self._start = time.monotonic()
        self.records = 0
        self.tokens = 0
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total_units, unit="unit", desc="write", dynamic_ncols=True, file=sys.stderr)

    def unit_done(self, *, records: int, tokens: int) -> None:
        """Count one unit finished (or reused) with its records and tokens."""
        self.records += records
        self.tokens += tokens
        if self._bar is None:
            return
        rate = self.tokens / max(time.monotonic() - self._start, 1e-9)
        self._bar.set_postfix_str(
            f"{self.records:,} records, {self.tokens:,} tokens, {rate:,.0f} tokens/s", refresh=False
        )
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
