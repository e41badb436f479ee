"""TorchTitan main's own data pipeline beside this loader, on one corpus, in main's batch form.

Main packs on each dp rank with Grain: ``ConcatThenSplitPackingConfig``
(documents laid end to end and split into batches of ``num_tokens_per_batch``
tokens; positions restart at every document and every ``max_context_length``
tokens) and ``FirstFitPackingConfig`` (whole documents first-fit into 8 open
bins; documents longer than the context are dropped). Beside them: this
loader's windows (``packing="concat"``) and rows of whole documents
(``"best_fit"``), through ``ZephonDataLoader`` built as main's trainer builds
it (1-D batches of the same token budget).

The corpus: this machine's Python standard library sources, tokenized with a
BPE trained on them (vocab 2000, as ``examples/torchtitan/make_tokenizer.py``
trains), cut into documents of web-like lengths (log-normal, median 500
tokens, sigma 1.1), written once as JSONL (what main reads, tokenizing in its
pipeline) and once as a dataset (what this loader reads).

Per pipeline, one pass at dp 1 (main refuses ``repeat=False`` at dp > 1),
measured from the batches as the trainer receives them:
- trained: (input, target) pairs with a label, against the corpus's pairs
  (each document's tokens predicting the next, its last the EOS);
- dropped: the corpus's pairs a pass never trains;
- padding: slots that hold no document token (labels -100 there);
- EOS slots: input slots holding a document's EOS, which train nothing under
  ``cross_document_targets="ignore"`` (main's text processor leaves EOS out
  of the inputs);
- cuts: attention segments (runs of positions from 0) that end inside a
  document (neither their last input nor their last label an EOS), per 1,000
  documents; the floor is what any packing into segments of
  ``max_context_length`` must cut (a document of n pairs spans ceil(n / L)).
Then the resume: a state saved at dp 2 after ``--resume-step`` steps, loaded
at dp 3 (main: refused; ours: the next steps compared with an uninterrupted
reading). And the trainer's CPU per step: ``time.thread_time()`` around each
``next()`` (median) and the trainer process's CPU per step, all its threads
(Grain's threads run in it; this loader's helper process does not), with
``--work-ms`` of Python work between steps; ``--trials`` rounds, the pipelines
in turn.

Needs TorchTitan main's source: ``--titan-main`` (a ``torchtitan-main-*.tar.gz``
or a source folder; default ``$ZEPHON_TORCHTITAN_MAIN``, else
``../shared/vendor/`` beside the repository) and ``grain``.

    python benchmarks/bench_titan_main.py --work-dir /tmp/bench-titan-main

The last printed line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_train_overhead import calibrate, python_work  # noqa: E402

PIPELINES = ("main concat-then-split", "main first-fit", "ours concat", "ours best_fit")


def titan_main_source(named: str | None) -> Path:
    if named:
        return Path(named)
    found = sorted((REPO.parent / "shared" / "vendor").glob("torchtitan-main-*.tar.gz"))
    if not found:
        sys.exit(
            "bench_titan_main: TorchTitan main's source not found: pass --titan-main or set ZEPHON_TORCHTITAN_MAIN"
        )
    return found[-1]


def run_against_main(args: argparse.Namespace) -> None:
    """Run this script again with TorchTitan main's source first on the path."""
    source = titan_main_source(args.titan_main or os.environ.get("ZEPHON_TORCHTITAN_MAIN"))
    with tempfile.TemporaryDirectory(prefix="zs-titan-main-") as unpacked:
        if source.is_dir():
            folder = source
        else:
            with tarfile.open(source) as archive:
                archive.extractall(unpacked, filter="data")
            folder = next(Path(unpacked).iterdir())
        path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH"), str(REPO)) if p)
        done = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--in-main"], env={**os.environ, "PYTHONPATH": path}, check=False
        )
    sys.exit(done.returncode)


# -- the corpus ---------------------------------------------------------------------------


def make_corpus(work: Path, num_docs: int, seed: int) -> dict:
    """Tokenizer, JSONL corpus and dataset in ``work`` (made once); their figures."""
    from tokenizers import Tokenizer

    from zephon_stream import write_dataset

    tok_dir, jsonl, dataset = work / "tok", work / "corpus.jsonl", work / "dataset"
    if not (tok_dir / "tokenizer.json").exists():
        stdlib = sysconfig.get_paths()["stdlib"]
        subprocess.run(
            [sys.executable, str(REPO / "examples/torchtitan/make_tokenizer.py"), stdlib, "--output", str(tok_dir)],
            check=True,
            capture_output=True,
        )
    tokenizer = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    if not jsonl.exists():
        texts = []
        root = Path(sysconfig.get_paths()["stdlib"])
        for path in sorted(root.rglob("*.py")):
            if "site-packages" in path.relative_to(root).parts:
                continue
            try:
                texts.append(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, OSError):
                continue
        ids = np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in tokenizer.encode_batch(texts)])
        rng = np.random.default_rng(seed)
        lengths = np.maximum(1, rng.lognormal(np.log(500), 1.1, size=num_docs).astype(np.int64))
        starts = np.concatenate([[0], np.cumsum(lengths)])
        if starts[-1] > ids.size:
            sys.exit(f"bench_titan_main: the stdlib holds {ids.size} tokens, fewer than {num_docs} documents need")
        with open(jsonl, "w", encoding="utf-8") as out:
            for start, end in zip(starts[:-1], starts[1:]):
                out.write(json.dumps({"text": tokenizer.decode(ids[start:end].tolist())}) + "\n")
    if not (dataset / "manifest").exists():
        write_dataset([str(jsonl)], str(dataset), tokenizer=f"hf:{tok_dir / 'tokenizer.json'}", progress=False)
    eos = tokenizer.token_to_id("<|endoftext|>")
    with open(jsonl, encoding="utf-8") as records:
        lengths = np.array([len(tokenizer.encode(json.loads(line)["text"]).ids) for line in records])
    return {
        "tok_dir": str(tok_dir),
        "jsonl": str(jsonl),
        "dataset": str(dataset),
        "eos": eos,
        "documents": int(lengths.size),
        "pairs": int(lengths.sum()),
        "median_tokens": float(np.median(lengths)),
        "lengths": lengths,
    }


# -- the pipelines, as main's trainer builds a loader -------------------------------------------


def build(name: str, corpus: dict, *, seq_len: int, tokens: int, dp: int = 1, rank: int = 0, repeat: bool = False):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from zephon_stream.integrations.torchtitan import ZephonDataLoader

    tokenizer = HuggingFaceTokenizer.Config().build(tokenizer_path=corpus["tok_dir"])
    shape = {
        "dp_world_size": dp,
        "dp_rank": rank,
        "tokenizer": tokenizer,
        "max_context_length": seq_len,
        "num_tokens_per_batch": tokens,
    }
    if name.startswith("ours"):
        config = ZephonDataLoader.Config(dataset_path=corpus["dataset"], seed=3, packing=name.split()[1], repeat=repeat)
        return config.build(**shape)
    from torchtitan.components.data import (
        ConcatThenSplitPackingConfig,
        FirstFitPackingConfig,
        GrainDataLoader,
        IndexedJsonlSource,
        SingleDatasetConfig,
    )
    from torchtitan.hf_datasets.text_datasets import TextProcessor

    source = SingleDatasetConfig(
        source=IndexedJsonlSource.Config(patterns=(corpus["jsonl"],)),
        processor=TextProcessor.Config(),
        post_filters=(lambda sample: sample is not None,),
    )
    packing = (
        ConcatThenSplitPackingConfig(dataset=source) if "concat" in name else FirstFitPackingConfig(dataset=source)
    )
    return GrainDataLoader.Config(dataset=packing, seed=3, repeat=repeat).build(**shape)


def one_pass(name: str, corpus: dict, *, seq_len: int, tokens: int) -> dict:
    """What one pass at dp 1 trains, drops, pads and cuts."""
    eos = corpus["eos"]
    trained = padding = eos_slots = slots = cuts = steps = 0
    loader = build(name, corpus, seq_len=seq_len, tokens=tokens)
    try:
        for input_dict, labels in loader:
            inputs, positions = input_dict["input"].numpy(), input_dict["positions"].numpy()
            labels = labels.numpy()
            steps += 1
            slots += labels.size
            trained += int((labels != -100).sum())
            ignored = labels == -100
            at_eos = ignored & (inputs == eos) if name.startswith("ours") else np.zeros_like(ignored)
            eos_slots += int(at_eos.sum())
            padding += int((ignored & ~at_eos).sum())
            starts = np.flatnonzero(positions == 0)
            ends = np.append(starts[1:], positions.size) - 1
            for start, end in zip(starts, ends):
                if (labels[start : end + 1] == -100).all() and not at_eos[start : end + 1].any():
                    continue  # a padding segment
                if inputs[end] != eos and labels[end] != eos:
                    cuts += 1
    finally:
        loader.close()
    return {
        "steps": steps,
        "trained_pairs": trained,
        "trained_share": trained / corpus["pairs"],
        "dropped_pairs": max(0, corpus["pairs"] - trained),
        "padding_share": padding / slots,
        "eos_slot_share": eos_slots / slots,
        "cuts_per_1000_docs": 1000 * cuts / corpus["documents"],
    }


def resume(name: str, corpus: dict, *, seq_len: int, rows: int, steps: int) -> str:
    """A dp-2 state after ``steps`` steps loaded at dp 3, the global batch held (6 x ``rows`` rows)."""
    global_rows = 6 * rows
    saving = [
        build(name, corpus, seq_len=seq_len, tokens=global_rows // 2 * seq_len, dp=2, rank=r, repeat=True)
        for r in range(2)
    ]
    try:
        for loader in saving:
            batches = iter(loader)
            for _ in range(steps):
                next(batches)
        state = saving[0].state_dict()
    finally:
        for loader in saving:
            loader.close()
    resumed = [
        build(name, corpus, seq_len=seq_len, tokens=global_rows // 3 * seq_len, dp=3, rank=r, repeat=True)
        for r in range(3)
    ]
    try:
        try:
            for loader in resumed:
                loader.load_state_dict(state)
        except ValueError as exc:
            return f"refused: {exc}"
        got = [
            np.concatenate([next(loader)[0]["input"].numpy().reshape(-1, seq_len) for loader in resumed])
            for _ in range(3)
        ]
    finally:
        for loader in resumed:
            loader.close()
    reference = build(name, corpus, seq_len=seq_len, tokens=global_rows * seq_len, repeat=True)
    try:
        batches = iter(reference)
        for _ in range(steps):
            next(batches)
        want = [next(batches)[0]["input"].numpy().reshape(-1, seq_len) for _ in range(3)]
    finally:
        reference.close()
    same = sum(np.array_equal(g, w) for g, w in zip(got, want))
    return f"exact: {same} of 3 steps after the resume equal the uninterrupted run's"


def step_cpu(name: str, corpus: dict, *, seq_len: int, tokens: int, steps: int, work: int) -> dict:
    """Median CPU in the trainer's thread per ``next()``, and the process's CPU per step
    beyond the Python work (which is measured in the same loop and taken off)."""
    loader = build(name, corpus, seq_len=seq_len, tokens=tokens, repeat=True)
    try:
        batches = iter(loader)
        next(batches)
        thread_us, work_s = [], 0.0
        started = time.process_time()
        for _ in range(steps):
            before = time.thread_time()
            python_work(work)
            work_s += time.thread_time() - before
            before = time.thread_time()
            next(batches)
            thread_us.append(1e6 * (time.thread_time() - before))
        process_ms = 1e3 * (time.process_time() - started - work_s) / steps
    finally:
        loader.close()
    return {"next_thread_us": statistics.median(thread_us), "process_ms_per_step": process_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--titan-main", help="TorchTitan main's source: an archive or a folder")
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "bench-titan-main"))
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=8, help="rows of seq_len a batch (main's default: 8 x 2048)")
    parser.add_argument("--steps", type=int, default=40, help="steps timed per trial")
    parser.add_argument("--work-ms", type=float, default=20.0, help="Python work between steps")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--resume-step", type=int, default=5)
    parser.add_argument("--in-main", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.in_main:
        run_against_main(args)
    from zephon_stream.integrations.torchtitan import TITAN

    assert TITAN.name == "main", f"TorchTitan {TITAN.name} found where main was put first on the path"
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(work, args.docs, seed=0)
    lengths = corpus.pop("lengths")
    tokens = args.rows * args.seq_len
    # Cuts any packing into attention segments of seq_len makes: a document of n pairs spans ceil(n / L) segments.
    corpus["floor_cuts_per_1000_docs"] = 1000 * float((np.ceil(lengths / args.seq_len) - 1).sum()) / lengths.size
    print(
        f"corpus: {corpus['documents']} documents, {corpus['pairs']} pairs, median {corpus['median_tokens']:.0f} "
        f"tokens, {100 * (lengths > args.seq_len).mean():.1f}% longer than {args.seq_len}"
    )
    result: dict = {
        "corpus": {**corpus, "share_longer_than_context": float((lengths > args.seq_len).mean())},
        "seq_len": args.seq_len,
        "tokens_per_batch": tokens,
        "pipelines": {},
    }
    for name in PIPELINES:
        figures = one_pass(name, corpus, seq_len=args.seq_len, tokens=tokens)
        figures["resume_dp2_to_dp3"] = resume(name, corpus, seq_len=args.seq_len, rows=1, steps=args.resume_step)
        result["pipelines"][name] = figures
        print(f"{name}: {json.dumps(figures)}", flush=True)
    iterations = calibrate(args.work_ms)
    trials: dict[str, list[dict]] = {name: [] for name in PIPELINES}
    for trial in range(args.trials):
        order = PIPELINES if trial % 2 == 0 else tuple(reversed(PIPELINES))
        for name in order:
            trials[name].append(
                step_cpu(name, corpus, seq_len=args.seq_len, tokens=tokens, steps=args.steps, work=iterations)
            )
    for name in PIPELINES:
        figures = result["pipelines"][name]
        figures["next_thread_us"] = statistics.median(t["next_thread_us"] for t in trials[name])
        figures["process_ms_per_step"] = statistics.median(t["process_ms_per_step"] for t in trials[name])
        print(
            f"{name}: next() {figures['next_thread_us']:.0f} us in the trainer's thread; the trainer process "
            f"{figures['process_ms_per_step']:.1f} ms of CPU a step besides its own work",
            flush=True,
        )
    result["load_average"] = os.getloadavg()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
