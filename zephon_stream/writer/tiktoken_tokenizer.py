"""The ``tiktoken`` adapter: a named encoding from tiktoken's local cache, or
ranks from a ``.tiktoken`` file."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zephon_stream.errors import TokenizerError
from zephon_stream.writer.tokenizer_base import EOS_CANDIDATES, Tokenizer

# A bare .tiktoken file holds ranks only; this is the split pattern of
# the widely used cl100k_base encoding, recorded in the fingerprint.
DEFAULT_TIKTOKEN_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
TIKTOKEN_EOS = "<|endoftext|>"


class TiktokenTokenizer(Tokenizer):
    """A ``tiktoken`` encoding: a named one from the local cache, or ranks from a file."""

    kind = "tiktoken"

    def __init__(
        self,
        *,
        name: str,
        ranks: dict[bytes, int],
        pattern: str,
        special_tokens: dict[str, int],
        eos_token: str | None = None,
        bos_token: str | None = None,
        eos_id: int | None = None,
        bos_id: int | None = None,
    ):
        import tiktoken

        self.name = name
        self._enc = tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special_tokens)
        self._ranks = ranks
        self._special_tokens = special_tokens
        self.vocab_size = self._enc.n_vocab
        if eos_id is None:
            eos_id = self._special_id(eos_token or self._default_eos(special_tokens))
        if bos_id is None and bos_token:
            bos_id = self._special_id(bos_token)
        self.eos_id = eos_id
        self.bos_id = bos_id
        self._state = {
            "name": name,
            "ranks": ranks,
            "pattern": pattern,
            "special_tokens": special_tokens,
            "eos_id": eos_id,
            "bos_id": bos_id,
        }
        self.fingerprint = tiktoken_fingerprint(ranks, pattern, special_tokens)

    def _default_eos(self, special_tokens: dict[str, int]) -> str:
        for token in EOS_CANDIDATES:
            if token in special_tokens:
                return token
        raise TokenizerError(
            f"tiktoken encoding {self.name}: none of {', '.join(EOS_CANDIDATES)} is a special token; "
            "name the end-of-document token with --eos-token"
        )

    def _special_id(self, token: str) -> int:
        if token in self._special_tokens:
            return self._special_tokens[token]
        token_id = self._ranks.get(token.encode("utf-8"))
        if token_id is None:
            raise TokenizerError(f"tiktoken encoding {self.name}: token {token!r} is not in its vocabulary")
        return token_id

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # Special-token text inside a document is ordinary text here.
        return self._enc.encode_ordinary_batch(list(texts), num_threads=1)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._enc.decode([int(i) for i in ids])

    def __getstate__(self) -> dict[str, Any]:
        return dict(self._state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)


def tiktoken_fingerprint(ranks: dict[bytes, int], pattern: str, special_tokens: dict[str, int]) -> str:
    """sha256 over the ranks (in the .tiktoken text form), the split pattern and the special tokens."""
    digest = hashlib.sha256()
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        digest.update(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")
    digest.update(b"pattern " + pattern.encode("utf-8") + b"\n")
    for token, rank in sorted(special_tokens.items(), key=lambda item: item[1]):
        digest.update(b"special " + token.encode("utf-8") + b" " + str(rank).encode() + b"\n")
    return digest.hexdigest()


def load_tiktoken(
    name: str,
    *,
    eos_token: str | None = None,
    bos_token: str | None = None,
    eos_id: int | None = None,
    bos_id: int | None = None,
) -> TiktokenTokenizer:
    """A tiktoken encoding by name (from tiktoken's local cache) or from a ``.tiktoken`` file.

    Raises:
        TokenizerError: unknown name, files not available offline, or an unreadable file.
    """
    import tiktoken

    if name.endswith(".tiktoken") or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise TokenizerError(f"tokenizer tiktoken:{name}: no such .tiktoken file; {_SPECS}")
        ranks = read_tiktoken_ranks(path)
        specials = {TIKTOKEN_EOS: max(ranks.values()) + 1}
        return TiktokenTokenizer(
            name=name,
            ranks=ranks,
            pattern=DEFAULT_TIKTOKEN_PATTERN,
            special_tokens=specials,
            eos_token=eos_token,
            bos_token=bos_token,
            eos_id=eos_id,
            bos_id=bos_id,
        )
    # An unknown name is refused before tiktoken is asked for it: its
    # own error is three lines (plugins, version), and nothing is fetched.
    known = tiktoken.list_encoding_names()
    if name not in known:
        raise _unknown_error(name, known)
    try:
        enc = tiktoken.get_encoding(name)
    except ValueError as exc:
        if "Unknown encoding" in str(exc):
            raise _unknown_error(name, known) from None
        raise _offline_error(name, exc) from exc
    except Exception as exc:  # requests/urllib errors when its files are not cached
        raise _offline_error(name, exc) from exc
    return TiktokenTokenizer(
        name=name,
        ranks=enc._mergeable_ranks,
        pattern=enc._pat_str,
        special_tokens=enc._special_tokens,
        eos_token=eos_token,
        bos_token=bos_token,
        eos_id=eos_id,
        bos_id=bos_id,
    )


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """The ranks of a ``.tiktoken`` file: one ``base64(token) rank`` pair a line.

    Read here rather than with tiktoken's ``load_tiktoken_bpe``, which
    copies every file it reads into a cache under the machine's temp folder.
    """
    ranks = {}
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error) as exc:
            raise TokenizerError(f"tiktoken file {path} line {number}: cannot parse ranks: {exc}") from exc
    if not ranks:
        raise TokenizerError(f"tiktoken file {path}: holds no ranks")
    return ranks


_SPECS = (
    "a tiktoken spec is tiktoken:NAME of an encoding whose file is available offline (in TIKTOKEN_CACHE_DIR), "
    "or tiktoken:PATH of a .tiktoken file"
)


def _unknown_error(name: str, known: Sequence[str]) -> TokenizerError:
    return TokenizerError(
        f"tokenizer tiktoken:{name}: tiktoken has no encoding named {name!r} (it knows {', '.join(known)}); {_SPECS}"
    )


def _offline_error(name: str, exc: BaseException) -> TokenizerError:
    cache = os.environ.get("TIKTOKEN_CACHE_DIR", "<unset>")
    return TokenizerError(
        f"tokenizer tiktoken:{name}: the encoding's file is not available offline ({type(exc).__name__}); tiktoken "
        f"reads its files from TIKTOKEN_CACHE_DIR (now {cache}): copy the cached files there from a machine "
        "with network access, or pass tiktoken:PATH of a .tiktoken file"
    )
