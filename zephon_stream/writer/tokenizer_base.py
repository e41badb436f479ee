"""The tokenizer interface every adapter implements (``Tokenizer``) and the
EOS names tried when a tokenizer does not say which token ends a document.

The adapters (``tokenizers.py``: bytes and Hugging Face, with the spec
parser; ``tiktoken_tokenizer.py``) all build on this module.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zephon_stream.format.manifest import TokenizerInfo

# Names tried, in order, when a tokenizer does not say which token ends
# a document; `--eos-token` overrides the search.
EOS_CANDIDATES = (
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
    "<eos>",
    "<|eos|>",
    "[EOS]",
    "<|end|>",
)


class Tokenizer:
    """Base class of the adapters. Subclasses set the identity attributes and
    implement ``encode_batch`` and ``decode``."""

    kind: str
    name: str
    vocab_size: int
    eos_id: int
    bos_id: int | None
    fingerprint: str
    # False where encoding costs about what shipping the text to another
    # process does, so worker processes can never pay for themselves.
    worth_processes: bool = True

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, without BOS or EOS."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of a run of ids (special tokens rendered as text)."""
        raise NotImplementedError

    def encode_documents(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Tokens of each text framed as a document: BOS (when set), ids, EOS.

        Returns:
            ``(ids, lengths)``: all documents' tokens concatenated as int64,
            and each document's token count (framing included).
        """
        encoded = self.encode_batch(texts)
        extra = 1 + (self.bos_id is not None)
        lengths = np.fromiter((len(ids) + extra for ids in encoded), dtype=np.int64, count=len(encoded))
        flat = np.empty(int(lengths.sum()), dtype=np.int64)
        pos = 0
        for ids in encoded:
            if self.bos_id is not None:
                flat[pos] = self.bos_id
                pos += 1
            flat[pos : pos + len(ids)] = ids
            pos += len(ids)
            flat[pos] = self.eos_id
            pos += 1
        return flat, lengths

    def identity(self) -> TokenizerInfo:
        """The identity the manifest records."""
        return TokenizerInfo(
            kind=self.kind,
            name=self.name,
            vocab_size=self.vocab_size,
            eos_id=self.eos_id,
            bos_id=self.bos_id,
            fingerprint=self.fingerprint,
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size}, "
            f"eos_id={self.eos_id}, bos_id={self.bos_id}, fingerprint={self.fingerprint[:12]}...)"
        )
