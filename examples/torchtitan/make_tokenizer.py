"""Train a small byte-level BPE and save it as a TorchTitan ``hf_assets_path`` folder.

TorchTitan's llama3 debug model has 2048 embedding rows, so a dataset for it
needs a tokenizer with at most 2048 ids. This writes ``OUT/tokenizer.json``
(give it to ``zephon-stream write --tokenizer hf:OUT/tokenizer.json``) and
``OUT/tokenizer_config.json`` naming the EOS token, so TorchTitan's tokenizer
and the dataset's manifest agree on vocabulary size and EOS id.

    python examples/torchtitan/make_tokenizer.py --output ./assets/tokenizer-bpe2k \\
        "$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

EOS_TOKEN = "<|endoftext|>"


def iter_texts(root: Path, max_files: int):
    """UTF-8 text of up to ``max_files`` ``.py`` files under ``root`` (sorted),
    skipping installed packages (``site-packages``)."""
    count = 0
    for path in sorted(root.rglob("*.py")):
        if count >= max_files:
            return
        if "site-packages" in path.relative_to(root).parts:
            continue
        try:
            yield path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        count += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path, help="folder of .py files to train on")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--vocab-size", type=int, default=2000)
    parser.add_argument("--max-files", type=int, default=400)
    args = parser.parse_args()

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(iter_texts(args.corpus, args.max_files), trainer=trainer)
    args.output.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.output / "tokenizer.json"))
    (args.output / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS_TOKEN}, indent=2) + "\n")
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    print(f"{args.output}: vocab size {tokenizer.get_vocab_size()}, EOS {EOS_TOKEN!r} = id {eos_id}")


if __name__ == "__main__":
    main()
