"""CPU the trainer's thread spends per step in ``next()`` for each batch layout: ``"rows"`` against ``"tokens"``.

TorchTitan main trains 1-D batches. Before ``batch_layout="tokens"`` the
integration turned the loader's ``[rows, seq_len]`` tensors into 1-D ones
with three ``reshape(-1)`` calls a step; now the delivery makes each ring
slot's 1-D tensors once, as it makes the rows form's.

Part 1, one process, paired: three ``StreamingLoader``s over the same
dataset (the standard library's sources, ``bytes`` tokenizer, as
benchmarks/bench_next.py), each with its helper process, driven one step
each in turn with ``--work-ms`` of pure-Python work before every step, so
the machine's changes of pace fall on all three alike:

- ``rows``: ``next(loader)``, ``[rows, seq_len]`` (the baseline);
- ``rows_reshaped``: ``next(loader)`` and three ``reshape(-1)`` (main's batch as it was made);
- ``tokens``: ``next(loader)`` with ``batch_layout="tokens"``.

Each figure is the median of ``time.thread_time_ns()`` around what the
trainer calls, over ``--steps`` steps per form, printed with its ratio to
``rows``.

Part 2 (``--titan-main``, TorchTitan main's source: a folder or a
``torchtitan-main-*.tar.gz``): ``ZephonDataLoader`` built as each trainer
builds it, in child processes, the installed TorchTitan (0.3.0, ``[B, L]``)
and main (1-D) in turn for ``--trials`` rounds, the order flipped each
round; with ``--before-tree`` (a checkout of the package before the tokens
layout) also main through that tree. Printed: each form's median of the
rounds' medians and its ratio to 0.3.0's.

    python benchmarks/bench_layout.py --data-dir /tmp/bench-layout --titan-main ../shared/vendor/torchtitan-main.tar.gz

The last printed line is one JSON object with the figures and the load average.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if "--child" not in sys.argv:
    # A child's path is its parent's choice (a package tree from before the layout may come first).
    sys.path.insert(0, str(REPO))

from benchmarks.bench_read import build_dataset, dataset_parser  # noqa: E402
from benchmarks.bench_train_overhead import calibrate, python_work  # noqa: E402

FORMS = ("rows", "rows_reshaped", "tokens")
TOKEN_KEYS = ("input", "labels", "positions")


def wait_for_helper(loader, iterations: int) -> None:
    """Take steps until the loader's helper process serves them (its first steps come from threads)."""
    deadline = time.monotonic() + 120
    while loader.helper_pid is None and time.monotonic() < deadline:
        next(loader)
        python_work(iterations)
    if loader.helper_pid is None:
        raise RuntimeError("the helper process never took the run over")


def paired_forms(url: str, *, seq_len: int, local_batch: int, steps: int, warm_steps: int, iterations: int) -> dict:
    """Part 1: the three forms one step each in turn; median µs per form."""
    from zephon_stream import StreamingLoader

    common = {"seq_len": seq_len, "local_batch_size": local_batch, "seed": 7}
    loaders = {
        "rows": StreamingLoader(url, **common),
        "rows_reshaped": StreamingLoader(url, **common),
        "tokens": StreamingLoader(url, batch_layout="tokens", **common),
    }

    def reshaped() -> dict:
        batch = next(loaders["rows_reshaped"])
        return {**batch, **{key: batch[key].reshape(-1) for key in TOKEN_KEYS}}

    takes = {"rows": loaders["rows"].__next__, "rows_reshaped": reshaped, "tokens": loaders["tokens"].__next__}
    cpu_ns: dict[str, list[int]] = {name: [] for name in FORMS}
    try:
        for loader in loaders.values():
            for _ in range(warm_steps):
                next(loader)
            wait_for_helper(loader, iterations)
        kept: dict[str, dict] = {}
        for step in range(steps * len(FORMS)):
            name = FORMS[step % len(FORMS)]
            python_work(iterations)
            started = time.thread_time_ns()
            kept[name] = takes[name]()  # Kept until its next step, as a training loop keeps its batch
            cpu_ns[name].append(time.thread_time_ns() - started)
        assert kept["tokens"]["input"].shape == (local_batch * seq_len,)
        assert kept["rows"]["input"].shape == (local_batch, seq_len)
        kept.clear()
    finally:
        for loader in loaders.values():
            loader.close()
    medians = {name: statistics.median(cpu_ns[name]) / 1000 for name in FORMS}
    return {name: {"median_us": medians[name], "ratio_to_rows": medians[name] / medians["rows"]} for name in FORMS}


# -- part 2: through ZephonDataLoader, in a child per TorchTitan ------------------------------


def titan_child(url: str, *, seq_len: int, local_batch: int, steps: int, warm_steps: int, iterations: int) -> dict:
    """``ZephonDataLoader`` as the installed TorchTitan's trainer builds it: median µs in ``next()``."""
    from zephon_stream.integrations.torchtitan import TITAN, ZephonDataLoader

    shape = (
        {"max_context_length": seq_len, "num_tokens_per_batch": local_batch * seq_len}
        if TITAN.flat_batches
        else {"seq_len": seq_len, "local_batch_size": local_batch}
    )
    config = ZephonDataLoader.Config(dataset_path=url, seed=7)
    with config.build(dp_world_size=1, dp_rank=0, tokenizer=None, **shape) as loader:
        for _ in range(warm_steps):
            next(loader)
        wait_for_helper(loader.streaming_loader, iterations)
        cpu_ns = []
        for _ in range(steps):
            python_work(iterations)
            started = time.thread_time_ns()
            batch = next(loader)
            cpu_ns.append(time.thread_time_ns() - started)
        shape_seen = list(batch[0]["input"].shape)
        del batch
    return {"titan": TITAN.name, "median_us": statistics.median(cpu_ns) / 1000, "input_shape": shape_seen}


def unpacked(source: Path, into: str) -> Path:
    """TorchTitan main's source folder: ``source`` itself, or the archive unpacked into ``into``."""
    if source.is_dir():
        return source
    with tarfile.open(source) as archive:
        archive.extractall(into, filter="data")
    return next(Path(into).iterdir())


def run_child(args, iterations: int, *, path: list[str]) -> dict:
    """One child's figures, with ``path`` first on its ``PYTHONPATH``."""
    command = [
        sys.executable,
        __file__,
        "--child",
        "--data-dir",
        args.data_dir,
        "--seq-len",
        str(args.seq_len),
        "--local-batch",
        str(args.local_batch),
        "--steps",
        str(args.steps),
        "--warm-steps",
        str(args.warm_steps),
        "--iterations",
        str(iterations),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(REPO)])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"bench_layout child ({path}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def titan_forms(args, iterations: int, main_source: Path) -> dict:
    """Part 2: rounds of children, 0.3.0 and main (and main before the tokens layout) in turn."""
    forms = {"0.3.0": [], "main": []}
    if args.before_tree:
        forms["main_before"] = [str(Path(args.before_tree).resolve())]
    with tempfile.TemporaryDirectory(prefix="bench-layout-titan-") as tmp:
        main = str(unpacked(main_source, tmp))
        paths = {"0.3.0": [], "main": [main], "main_before": [*forms.get("main_before", []), main]}
        results: dict[str, list[float]] = {name: [] for name in forms}
        for trial in range(args.trials):
            order = list(forms) if trial % 2 == 0 else list(reversed(forms))
            for name in order:
                got = run_child(args, iterations, path=paths[name])
                results[name].append(got["median_us"])
                print(
                    f"  round {trial}: {name} (TorchTitan {got['titan']}, input {got['input_shape']}): "
                    f"{got['median_us']:.1f} us",
                    flush=True,
                )
    base = statistics.median(results["0.3.0"])
    return {
        name: {
            "median_us": statistics.median(values),
            "rounds_us": values,
            "ratio_to_0.3.0": statistics.median(values) / base,
        }
        for name, values in results.items()
    }


def main() -> None:
    parser = dataset_parser(__doc__)
    parser.set_defaults(local_batch=8)
    parser.add_argument("--steps", type=int, default=300, help="steps timed per form (part 1) and per child")
    parser.add_argument("--warm-steps", type=int, default=30)
    parser.add_argument("--work-ms", type=float, default=20.0, help="pure-Python work before every step")
    parser.add_argument("--trials", type=int, default=4, help="rounds of part 2")
    parser.add_argument("--titan-main", help="TorchTitan main's source (folder or archive): runs part 2")
    parser.add_argument("--before-tree", help="part 2 also through this checkout of the package (before the layout)")
    parser.add_argument("--child", action="store_true", help="internal: one part-2 measurement")
    parser.add_argument("--iterations", type=int, help="internal: the parent's calibrated work")
    args = parser.parse_args()
    if args.child:
        url = str(Path(args.data_dir) / "stdlib-bytes")
        print(
            json.dumps(
                titan_child(
                    url,
                    seq_len=args.seq_len,
                    local_batch=args.local_batch,
                    steps=args.steps,
                    warm_steps=args.warm_steps,
                    iterations=args.iterations,
                )
            )
        )
        return
    iterations = calibrate(args.work_ms)
    figures: dict = {
        "seq_len": args.seq_len,
        "local_batch": args.local_batch,
        "steps": args.steps,
        "work_ms": args.work_ms,
        "cpu_count": os.cpu_count(),
        "load_average_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="bench-layout-") as tmp:
        args.data_dir = args.data_dir or tmp
        url = Path(args.data_dir) / "stdlib-bytes"
        build_dataset(url, blocks_per_shard=2)
        paired = paired_forms(
            str(url),
            seq_len=args.seq_len,
            local_batch=args.local_batch,
            steps=args.steps,
            warm_steps=args.warm_steps,
            iterations=iterations,
        )
        figures["streaming_loader"] = paired
        for name in FORMS:
            print(
                f"{args.local_batch} x {args.seq_len} {name}: next() CPU per step median "
                f"{paired[name]['median_us']:.1f} us, {paired[name]['ratio_to_rows']:.2f}x rows"
            )
        if args.titan_main:
            titan = titan_forms(args, iterations, Path(args.titan_main))
            figures["zephon_data_loader"] = titan
            for name, entry in titan.items():
                print(
                    f"ZephonDataLoader {name}: next() CPU per step median {entry['median_us']:.1f} us, "
                    f"{entry['ratio_to_0.3.0']:.2f}x 0.3.0's"
                )
    figures["load_average_end"] = os.getloadavg()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
