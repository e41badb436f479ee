"""Tokenizer adapters: one small interface over the built-in byte tokenizer,
Hugging Face ``tokenizers`` files and ``tiktoken`` encodings.

A spec string picks one: ``bytes``, ``hf:PATH_OR_URL`` (a ``tokenizer.json``,
or a folder holding one) or ``tiktoken:NAME`` / ``tiktoken:/path/file.tiktoken`` (see
``tiktoken_tokenizer.py``).

Every adapter is picklable: it pickles the bytes it was built from (never a
path to re-read), so worker processes rebuild exactly the tokenizer the
parent fingerprinted without touching storage.

NOTE on threads: HF ``tokenizers`` runs ``encode_batch`` on its own Rayon
thread pool unless ``TOKENIZERS_PARALLELISM=false``. The writer's worker
processes set it to ``false`` (N processes already use N cores and a pool per
process would oversubscribe them); with ``workers=1`` the writer tokenizes in
its own process and leaves the variable as the user set it, so that pool
then uses every core.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zephon_stream.errors import TokenizerError
from zephon_stream.writer.tokenizer_base import EOS_CANDIDATES, Tokenizer

# HF `tokenizers` holds ~470 bytes per token while it encodes one text
# (a 4.7 MB source file peaked at 600+ MiB); longer texts are encoded in
# pieces cut where cutting provably changes nothing (HFTokenizer._cuts).
LONG_TEXT_CHARS = 1 << 18
CUT_CHECK_CHARS = 1024
CUT_TRIES = 64
BYTES_VOCAB_SIZE = 257
BYTES_EOS_ID = 256


class BytesTokenizer(Tokenizer):
    """Built-in tokenizer: each UTF-8 byte is its own id (0-255), EOS is 256."""

    kind = "bytes"
    name = "bytes"
    vocab_size = BYTES_VOCAB_SIZE
    eos_id = BYTES_EOS_ID
    bos_id = None
    fingerprint = hashlib.sha256(b"bytes-v1").hexdigest()
    worth_processes = False  # Encoding is a UTF-8 copy

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(text.encode("utf-8")) for text in texts]

    def encode_documents(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        # One bulk copy instead of per-token Python ints: with the EOS
        # appended as a separator byte slot, the whole batch is one frombuffer.
        encoded = [text.encode("utf-8") for text in texts]
        lengths = np.fromiter((len(b) + 1 for b in encoded), dtype=np.int64, count=len(encoded))
        flat = np.frombuffer(b"\x00".join(encoded) + b"\x00", dtype=np.uint8).astype(np.int64)
        ends = np.cumsum(lengths) - 1
        flat[ends] = self.eos_id
        return flat, lengths

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() > BYTES_EOS_ID):
            raise TokenizerError(f"bytes tokenizer: ids outside [0, {BYTES_EOS_ID}] cannot be decoded")
        parts = np.split(ids, np.flatnonzero(ids == BYTES_EOS_ID))
        pieces = []
        for i, part in enumerate(parts):
            body = part[1:] if i else part
            if i:
                pieces.append("<|endoftext|>")
            pieces.append(body.astype(np.uint8).tobytes().decode("utf-8", errors="replace"))
        return "".join(pieces)


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer built from ``tokenizer.json`` bytes."""

    kind = "hf"

    def __init__(
        self,
        data: bytes,
        *,
        name: str,
        eos_token: str | None = None,
        bos_token: str | None = None,
        eos_id: int | None = None,
        bos_id: int | None = None,
    ):
        self._data = bytes(data)
        self.name = name
        from tokenizers import Tokenizer as RawTokenizer

        try:
            self._tok = RawTokenizer.from_str(self._data.decode("utf-8"))
        except Exception as exc:  # the library raises a bare Exception on bad JSON
            raise TokenizerError(f"hf tokenizer {name}: cannot parse tokenizer.json: {exc}") from exc
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(self._tok.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)
        if eos_id is None:
            eos_id = self._special_id(eos_token) if eos_token else self._find_eos()
        if bos_id is None and bos_token:
            bos_id = self._special_id(bos_token)
        self.eos_id = eos_id
        self.bos_id = bos_id
        self.fingerprint = hashlib.sha256(self._data).hexdigest()
        self._encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)

    def _special_id(self, token: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise TokenizerError(f"hf tokenizer {self.name}: token {token!r} is not in its vocabulary")
        return token_id

    def _find_eos(self) -> int:
        for token in EOS_CANDIDATES:
            token_id = self._tok.token_to_id(token)
            if token_id is not None:
                return token_id
        raise TokenizerError(
            f"hf tokenizer {self.name}: none of {', '.join(EOS_CANDIDATES)} is in its vocabulary; "
            "name the end-of-document token with --eos-token"
        )

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        texts = list(texts)
        if all(len(text) <= LONG_TEXT_CHARS for text in texts):
            return [enc.ids for enc in self._encode(texts, add_special_tokens=False)]
        out: list[list[int]] = [[] for _ in texts]
        short = [i for i, text in enumerate(texts) if len(text) <= LONG_TEXT_CHARS]
        for i, enc in zip(short, self._encode([texts[i] for i in short], add_special_tokens=False)):
            out[i] = enc.ids
        for i, text in enumerate(texts):
            if len(text) > LONG_TEXT_CHARS:
                out[i] = self._encode_long(text)
        return out

    def _ids(self, text: str) -> list[int]:
        return self._encode([text], add_special_tokens=False)[0].ids

    def _encode_long(self, text: str) -> list[int]:
        """The ids of one long text, encoded a piece at a time (same ids as in one go)."""
        ids: list[int] = []
        start = 0
        for cut in self._cuts(text):
            ids += self._ids(text[start:cut])
            start = cut
        return ids + self._ids(text[start:])

    def _cuts(self, text: str):
        """Offsets about every LONG_TEXT_CHARS where the text may be cut.

        A cut goes just after a newline between two non-space characters, and
        only where encoding the 2 KiB around it whole and in two halves gives
        the same ids: then no pre-token and no merge crosses it (a tokenizer
        whose normalizer or pre-tokenizer looks further, e.g. one that marks
        the start of the text, fails the check and is not cut there).
        """
        pos = LONG_TEXT_CHARS
        while pos < len(text) - LONG_TEXT_CHARS // 4:
            found = None
            for _ in range(CUT_TRIES):
                newline = text.find("\n", pos, len(text) - 1)
                if newline < 1:
                    break
                cut, pos = newline + 1, newline + 1
                if text[newline - 1].isspace() or text[cut].isspace():
                    continue
                left, right = text[max(0, cut - CUT_CHECK_CHARS) : cut], text[cut : cut + CUT_CHECK_CHARS]
                if self._ids(left + right) == self._ids(left) + self._ids(right):
                    found = cut
                    break
            if found is None:
                if text.find("\n", pos, len(text) - 1) < 1:
                    return
                continue
            yield found
            pos = found + LONG_TEXT_CHARS

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"data": self._data, "name": self.name, "eos_id": self.eos_id, "bos_id": self.bos_id}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["data"], name=state["name"], eos_id=state["eos_id"], bos_id=state["bos_id"])


def load_tokenizer(
    spec: str,
    *,
    eos_token: str | None = None,
    bos_token: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Tokenizer:
    """Build a tokenizer from a spec string.

    Args:
        spec: ``bytes``, ``hf:PATH_OR_URL`` or ``tiktoken:NAME_OR_PATH``.
        eos_token: token that ends each document (default: found by name).
        bos_token: token that starts each document (default: none).
        storage_options: options for reading an ``hf:`` file from an object store.

    Raises:
        TokenizerError: unknown spec, missing file, or no usable EOS token.
    """
    if isinstance(spec, Tokenizer):
        return spec
    kind, _, rest = spec.partition(":")
    if spec == "bytes":
        if eos_token or bos_token:
            raise TokenizerError("the bytes tokenizer has fixed special ids (EOS 256, no BOS)")
        return BytesTokenizer()
    if kind == "hf" and rest:
        data = _read_hf_json(rest, storage_options)
        return HFTokenizer(data, name=rest, eos_token=eos_token, bos_token=bos_token)
    if kind == "tiktoken" and rest:
        from zephon_stream.writer.tiktoken_tokenizer import load_tiktoken

        return load_tiktoken(rest, eos_token=eos_token, bos_token=bos_token)
    raise TokenizerError(f"unknown tokenizer spec {spec!r} (expected 'bytes', 'hf:PATH_OR_URL' or 'tiktoken:NAME')")


def _read_hf_json(location: str, storage_options: dict[str, Any] | None) -> bytes:
    if "://" in location and not location.startswith("file://"):
        from zephon_stream.storage import open_store

        parent, _, leaf = location.rstrip("/").rpartition("/")
        if not leaf.endswith(".json"):
            parent, leaf = location.rstrip("/"), "tokenizer.json"
        try:
            return open_store(parent, storage_options).read(leaf)
        except FileNotFoundError as exc:
            raise TokenizerError(f"hf tokenizer {location}: {leaf} not found in {parent}") from exc
    path = Path(location.removeprefix("file://"))
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(
            f"hf tokenizer {location}: {path} is not a file (give a tokenizer.json or a folder holding one)"
        )
    return path.read_bytes()


def tokenizer_from_manifest(
    info: Any,
    *,
    spec: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Tokenizer:
    """Rebuild the tokenizer a dataset was written with, and check it is the same one.

    Args:
        info: the manifest's tokenizer record (``kind``, ``name``, ``vocab_size``,
            ``eos_id``, ``bos_id``, ``fingerprint`` as attributes or keys).
        spec: where to load it from when ``info.name`` no longer points at it
            (e.g. ``hf:/new/place/tokenizer.json``).
        storage_options: options for reading an ``hf:`` file from an object store.

    Raises:
        TokenizerError: it cannot be loaded, or its fingerprint or ids differ.
    """

    def field(key: str) -> Any:
        return info[key] if isinstance(info, dict) else getattr(info, key)

    kind, name = field("kind"), field("name")
    spec = spec or ("bytes" if kind == "bytes" else f"{kind}:{name}")
    spec_kind, _, location = spec.partition(":")
    ids = {"eos_id": field("eos_id"), "bos_id": field("bos_id")}
    if spec == "bytes":
        tok: Tokenizer = BytesTokenizer()
    elif spec_kind == "hf" and location:
        tok = HFTokenizer(_read_hf_json(location, storage_options), name=location, **ids)
    elif spec_kind == "tiktoken" and location:
        from zephon_stream.writer.tiktoken_tokenizer import load_tiktoken

        tok = load_tiktoken(location, **ids)
    else:
        raise TokenizerError(f"unknown tokenizer spec {spec!r} for a manifest tokenizer of kind {kind!r}")
    expected = field("fingerprint")
    if tok.kind != kind or tok.fingerprint != expected:
        raise TokenizerError(
            f"tokenizer {spec}: not the one the dataset was written with "
            f"(manifest {kind} {expected}, loaded {tok.kind} {tok.fingerprint})"
        )
    for key in ("vocab_size", "eos_id", "bos_id"):
        if getattr(tok, key) != field(key):
            raise TokenizerError(
                f"tokenizer {spec}: {key} mismatch (manifest {field(key)}, loaded {getattr(tok, key)})"
            )
    return tok
