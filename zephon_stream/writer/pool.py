"""Tokenization on N processes, results in submission order.

``workers=1`` tokenizes in this process (on one helper thread, so reading and
compression overlap with it: the HF and tiktoken encoders release the GIL).
``workers>1`` starts N processes with the ``spawn`` method: forking a parent
that holds s3fs/aiohttp threads or a tokenizers thread pool can deadlock the
child. Each process sets ``TOKENIZERS_PARALLELISM=false`` before it builds its
tokenizer, so N processes use N cores and no more.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np

from zephon_stream.errors import TokenizerError
from zephon_stream.writer.tokenizers import Tokenizer

_worker_tokenizer: Tokenizer | None = None
_worker_dtype: np.dtype | None = None


def _exit_with_parent() -> None:
    parent = multiprocessing.parent_process()
    if parent is not None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)


def _init_worker(tokenizer_state: bytes, dtype: str) -> None:
    global _worker_tokenizer, _worker_dtype
    # A worker blocks on its task queue, whose pipe it holds both ends
    # of, so it never sees EOF: if the parent is SIGKILLed (OOM killer, a
    # scheduler), the workers and the resource tracker would live on forever.
    threading.Thread(target=_exit_with_parent, name="zs-parent-watch", daemon=True).start()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_tokenizer = pickle.loads(tokenizer_state)
    _worker_dtype = np.dtype(dtype)


def _tokenize_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    assert _worker_tokenizer is not None and _worker_dtype is not None
    return encode_chunk(_worker_tokenizer, texts, _worker_dtype)


def encode_chunk(tokenizer: Tokenizer, texts: Sequence[str], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of ``texts`` framed as documents, cast to the dataset's dtype.

    Returns:
        ``(tokens, lengths)``: tokens of ``dtype``, token count per document.

    Raises:
        TokenizerError: an id outside ``[0, vocab_size)``.
    """
    ids, lengths = tokenizer.encode_documents(texts)
    if ids.size:
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= tokenizer.vocab_size:
            raise TokenizerError(
                f"tokenizer {tokenizer.name}: produced id {high if high >= tokenizer.vocab_size else low}, "
                f"outside [0, {tokenizer.vocab_size})"
            )
    return ids.astype(dtype), lengths


class TokenizePool:
    """Submit chunks of texts; take results back in the order submitted.

    Args:
        tokenizer: the tokenizer (pickled once for the worker processes).
        dtype: the dataset's token dtype.
        workers: processes; 1 tokenizes in this process.
        max_in_flight: chunks submitted but not yet taken back.
    """

    def __init__(self, *, tokenizer: Tokenizer, dtype: np.dtype, workers: int, max_in_flight: int) -> None:
        self._dtype = dtype
        self._tokenizer = tokenizer
        self._executor: Executor
        if workers <= 1:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zs-tokenize")
        else:
            self._executor = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(pickle.dumps(tokenizer), dtype.str),
            )
        self._in_process = workers <= 1
        self._pending: deque[tuple[Future[tuple[np.ndarray, np.ndarray]], object]] = deque()
        self.max_in_flight = max_in_flight

    @property
    def full(self) -> bool:
        """Whether the next submit should wait for a result first."""
        return len(self._pending) >= self.max_in_flight

    def __len__(self) -> int:
        return len(self._pending)

    def submit(self, texts: list[str], tag: object) -> None:
        """Queue ``texts``; ``tag`` comes back with their tokens."""
        if self._in_process:
            future = self._executor.submit(encode_chunk, self._tokenizer, texts, self._dtype)
        else:
            future = self._executor.submit(_tokenize_in_worker, texts)
        self._pending.append((future, tag))

    def take(self) -> tuple[np.ndarray, np.ndarray, object]:
        """The oldest submitted chunk's ``(tokens, lengths, tag)``, waiting for it."""
        future, tag = self._pending.popleft()
        tokens, lengths = future.result()
        return tokens, lengths, tag

    def close(self) -> None:
        """Stop the workers; queued chunks are dropped."""
        for future, _ in self._pending:
            future.cancel()
        self._pending.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> TokenizePool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
