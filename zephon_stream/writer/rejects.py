"""What a record that was not written carries: the ``Reject`` and the words of its detail.

Every reject becomes one line of the output's ``rejects.jsonl``; a detail
says where (a byte, a line and column) and what, as a whole sentence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

REJECT_REASONS = ("empty", "undecodable", "missing_field", "not_string", "bad_json")


@dataclass(frozen=True, slots=True)
class Reject:
    """A record that was not written, and why.

    Attributes:
        source: the input it came from.
        record: its record number in that input (0-based).
        reason: one of ``REJECT_REASONS``.
        detail: where and what, e.g. ``invalid UTF-8 at byte 1234``.
    """

    source: str
    record: int
    reason: str
    detail: str

    def to_json(self) -> str:
        """One line of ``rejects.jsonl`` (without the newline)."""
        return json.dumps(
            {"source": self.source, "record": self.record, "reason": self.reason, "detail": self.detail},
            ensure_ascii=False,
        )


def bad_json_detail(exc: json.JSONDecodeError, *, line_number: int) -> str:
    """The detail of a JSON line that does not parse: ``line 7: malformed JSON: Expecting value at column 3``.

    Args:
        exc: what ``json.loads`` raised for the line.
        line_number: the line as editors count it, from 1.
    """
    if not exc.doc.strip():
        return f"line {line_number}: blank line"
    # Some of json's messages end in "at" and read on into the position
    # ("Invalid control character at: line 1 column 9 (char 8)"); ``msg``
    # alone stops mid-sentence, so every one is followed by its column here.
    problem = exc.msg.removesuffix(" at")
    if problem.startswith("Invalid control character") and exc.pos < len(exc.doc):
        problem = f"{problem} U+{ord(exc.doc[exc.pos]):04X}"
    return f"line {line_number}: malformed JSON: {problem} at column {exc.colno}"


def a_type(value: object) -> str:
    """``value``'s type with its article, for a reject's detail: ``"an int"``, ``"a dict"``."""
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"
