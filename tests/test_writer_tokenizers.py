"""Tokenizer adapters: identity, framing, pickling and rebuilding from a manifest."""

from __future__ import annotations

import base64
import json
import pickle

import numpy as np
import pytest

from zephon_stream.cli import main
from zephon_stream.errors import TokenizerError
from zephon_stream.writer.tokenizers import (
    BYTES_EOS_ID,
    BytesTokenizer,
    HFTokenizer,
    load_tokenizer,
    tokenizer_from_manifest,
)


def test_bytes_tokenizer_ids_are_utf8_bytes_and_eos_256():
    tok = load_tokenizer("bytes")
    assert (tok.kind, tok.vocab_size, tok.eos_id, tok.bos_id) == ("bytes", 257, 256, None)
    ids, lengths = tok.encode_documents(["hé\x00", "", "z"])
    assert lengths.tolist() == [5, 1, 2]
    assert ids.tolist() == [104, 0xC3, 0xA9, 0, BYTES_EOS_ID, BYTES_EOS_ID, 122, BYTES_EOS_ID]
    assert tok.encode_batch(["hé"]) == [[104, 0xC3, 0xA9]]
    assert tok.decode([104, 0xC3, 0xA9]) == "hé"


def test_bytes_tokenizer_refuses_special_overrides():
    with pytest.raises(TokenizerError, match="fixed special ids"):
        load_tokenizer("bytes", eos_token="</s>")


def test_hf_tokenizer_round_trips_stdlib_text(bpe_tokenizer_json, stdlib_corpus):
    tok = load_tokenizer(f"hf:{bpe_tokenizer_json}")
    assert tok.kind == "hf" and tok.vocab_size == 2000
    assert tok.eos_id == tok._tok.token_to_id("<|endoftext|>")
    text = stdlib_corpus.texts[100]
    ids = tok.encode_batch([text])[0]
    assert len(ids) < len(text.encode("utf-8")) / 2  # it really merges
    assert tok.decode(ids) == text
    flat, lengths = tok.encode_documents([text, "x = 1\n"])
    assert flat.tolist() == ids + [tok.eos_id] + tok.encode_batch(["x = 1\n"])[0] + [tok.eos_id]
    assert lengths.tolist() == [len(ids) + 1, len(flat) - len(ids) - 1]


def test_hf_folder_spec_and_fingerprint_is_sha256_of_file(bpe_tokenizer_json):
    import hashlib

    tok = load_tokenizer(f"hf:{bpe_tokenizer_json.parent}")
    assert tok.fingerprint == hashlib.sha256(bpe_tokenizer_json.read_bytes()).hexdigest()


def test_hf_bos_and_eos_overrides(bpe_tokenizer_json, tmp_path):
    data = json.loads(bpe_tokenizer_json.read_text())
    data["added_tokens"].append(
        {
            "id": 2000,
            "content": "<s>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    tok = load_tokenizer(f"hf:{path}", bos_token="<s>")
    assert (tok.bos_id, tok.vocab_size) == (2000, 2001)
    flat, lengths = tok.encode_documents(["ab"])
    assert flat[0] == 2000 and flat[-1] == tok.eos_id and lengths[0] == len(flat)
    tok2 = load_tokenizer(f"hf:{path}", eos_token="<s>")
    assert tok2.eos_id == 2000
    with pytest.raises(TokenizerError, match="'<nope>' is not in its vocabulary"):
        load_tokenizer(f"hf:{path}", eos_token="<nope>")


def test_hf_without_known_eos_asks_for_eos_token(bpe_tokenizer_json, tmp_path):
    data = json.loads(bpe_tokenizer_json.read_text())
    for added in data["added_tokens"]:
        added["content"] = "<|sep|>"
    data["model"]["vocab"] = {("<|sep|>" if k == "<|endoftext|>" else k): v for k, v in data["model"]["vocab"].items()}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TokenizerError, match="--eos-token"):
        load_tokenizer(f"hf:{path}")
    assert load_tokenizer(f"hf:{path}", eos_token="<|sep|>").eos_id == 0


def test_missing_and_unknown_specs_are_named(tmp_path):
    with pytest.raises(TokenizerError, match="not a file"):
        load_tokenizer(f"hf:{tmp_path / 'nope.json'}")
    with pytest.raises(TokenizerError, match="unknown tokenizer spec 'gpt2'"):
        load_tokenizer("gpt2")


def test_tiktoken_name_without_cache_explains_offline_cache(monkeypatch, tmp_path):
    pytest.importorskip("tiktoken")
    import tiktoken.load

    def offline(blobpath):
        raise ConnectionError(f"no network here ({blobpath})")

    # A machine without network access, on every machine: the test never downloads.
    monkeypatch.setattr(tiktoken.load, "read_file", offline)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(
        TokenizerError,
        match=r"^tokenizer tiktoken:cl100k_base: the encoding's file is not available "
        r"offline \(ConnectionError\); tiktoken reads its files from TIKTOKEN_CACHE_DIR",
    ):
        load_tokenizer("tiktoken:cl100k_base")


def test_an_unknown_tiktoken_name_is_one_line_naming_the_spec_and_the_specs_there_are(monkeypatch, tmp_path, capsys):
    pytest.importorskip("tiktoken")
    import tiktoken.load

    def no_download(blobpath):
        raise AssertionError(f"tried to fetch {blobpath}")

    # Nothing may be fetched: the name is refused before tiktoken looks for its file.
    monkeypatch.setattr(tiktoken.load, "read_file", no_download)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    known = ", ".join(tiktoken.list_encoding_names())
    said = (
        f"tokenizer tiktoken:nosuch_enc: tiktoken has no encoding named 'nosuch_enc' (it knows {known}); a tiktoken "
        "spec is tiktoken:NAME of an encoding whose file is available offline (in TIKTOKEN_CACHE_DIR), or "
        "tiktoken:PATH of a .tiktoken file"
    )
    with pytest.raises(TokenizerError) as info:
        load_tokenizer("tiktoken:nosuch_enc")
    assert str(info.value) == said and "cl100k_base" in known
    (tmp_path / "a.txt").write_text("some text")
    assert main(["write", str(tmp_path / "a.txt"), "-o", str(tmp_path / "out"), "--tokenizer", "tiktoken:nosuch_enc",
                 "--no-progress"]) == 1  # fmt: skip
    assert capsys.readouterr().err == f"zephon-stream write: error: {said}\n"
    with pytest.raises(
        TokenizerError, match=r"^tokenizer tiktoken:\S+nope.tiktoken: no such .tiktoken file; a tiktoken spec"
    ):
        load_tokenizer(f"tiktoken:{tmp_path / 'nope.tiktoken'}")


def _write_tiktoken_file(bpe_tokenizer_json, path):
    """Ranks: the 256 single bytes, then the BPE fixture's multi-byte tokens."""
    byte_of = _byte_level_map()
    vocab = json.loads(bpe_tokenizer_json.read_text())["model"]["vocab"]
    ranks = [bytes([b]) for b in range(256)]
    seen = set(ranks)
    for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        if token.startswith("<|"):
            continue
        raw = bytes(byte_of[ch] for ch in token)
        if raw not in seen:
            seen.add(raw)
            ranks.append(raw)
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    return len(ranks)


def _byte_level_map():
    # The GPT-2 byte-to-unicode table, inverted.
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def test_tiktoken_file_spec_encodes_and_rebuilds(bpe_tokenizer_json, tmp_path, stdlib_corpus):
    path = tmp_path / "small.tiktoken"
    num_ranks = _write_tiktoken_file(bpe_tokenizer_json, path)
    tok = load_tokenizer(f"tiktoken:{path}")
    assert tok.kind == "tiktoken" and tok.eos_id == num_ranks and tok.vocab_size == num_ranks + 1
    text = stdlib_corpus.texts[5]
    ids = tok.encode_batch([text])[0]
    assert tok.decode(ids) == text and len(ids) < len(text.encode("utf-8"))
    again = pickle.loads(pickle.dumps(tok))
    assert again.encode_batch([text]) == [ids] and again.fingerprint == tok.fingerprint
    rebuilt = tokenizer_from_manifest(tok.identity())
    assert rebuilt.encode_batch([text]) == [ids]


def test_pickled_hf_tokenizer_is_the_same(bpe_tokenizer_json):
    tok = load_tokenizer(f"hf:{bpe_tokenizer_json}")
    again = pickle.loads(pickle.dumps(tok))
    assert isinstance(again, HFTokenizer)
    assert again.identity() == tok.identity()
    assert again.encode_batch(["def f(x):\n    return x\n"]) == tok.encode_batch(["def f(x):\n    return x\n"])


def test_tokenizer_from_manifest_checks_fingerprint(bpe_tokenizer_json, tmp_path):
    tok = load_tokenizer(f"hf:{bpe_tokenizer_json}")
    info = tok.identity()
    assert tokenizer_from_manifest(info).fingerprint == tok.fingerprint
    moved = tmp_path / "moved.json"
    moved.write_bytes(bpe_tokenizer_json.read_bytes())
    assert tokenizer_from_manifest(info, spec=f"hf:{moved}").eos_id == tok.eos_id
    other = tmp_path / "other.json"
    other.write_bytes(bpe_tokenizer_json.read_bytes() + b"\n")
    with pytest.raises(TokenizerError, match="not the one the dataset was written with"):
        tokenizer_from_manifest(info, spec=f"hf:{other}")
    assert isinstance(tokenizer_from_manifest(BytesTokenizer().identity()), BytesTokenizer)
    ids, _ = BytesTokenizer().encode_documents(["a"])
    assert np.array_equal(ids, [97, 256])


def test_a_long_text_is_encoded_in_pieces_to_the_ids_of_one_go(stdlib_corpus, bpe_tokenizer_json):
    from tokenizers import Tokenizer as RawTokenizer

    from zephon_stream.writer.tokenizers import LONG_TEXT_CHARS

    # About 1.2 MB of real sources, so several cuts land in code, blank lines and docstrings.
    long_text = "".join(stdlib_corpus.texts[:160])
    assert len(long_text) > 4 * LONG_TEXT_CHARS
    tok = load_tokenizer(f"hf:{bpe_tokenizer_json}")
    raw = RawTokenizer.from_file(str(bpe_tokenizer_json))
    texts = ["short one", long_text, "x = 1\n"]
    assert tok.encode_batch(texts) == [enc.ids for enc in raw.encode_batch(texts, add_special_tokens=False)]
    # Metaspace (SentencePiece-style) marks the start of a text, so cutting anywhere would add a mark.
    from tokenizers import pre_tokenizers

    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    marked = HFTokenizer(raw.to_str().encode(), name="metaspace")
    assert marked.encode_batch([long_text[: 2 * LONG_TEXT_CHARS]]) == [
        raw.encode(long_text[: 2 * LONG_TEXT_CHARS], add_special_tokens=False).ids
    ]
