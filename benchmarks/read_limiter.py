"""bench_read ``--limiter``: what the node's request-rate limiter costs a loader when the store never throttles.

The loader (one rank, helper process, a node cache folder so that its stores
map the node's limiter file, ``ZEPHON_NODE_CACHE``) reads the same dataset
from the same server (``--backend``, SeaweedFS by default) in paired trials,
the order alternating: with the limiter (the default) and with it off
(``storage_options={"zephon_throttle_limiter": False}``: the code path before
the limiter, no limiter object at all). Each trial gives the first pass's and
the steady passes' tokens/s and the median cold first batch of ``--repeats``
for both, and their ratios (limiter / off). Target: 1.0 within the noise of
the paired trials; the load average is printed beside every trial.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from benchmarks.bench_read_remote import backend_server, spread
from benchmarks.read_measurements import first_batch_s, loader_tokens_per_s
from zephon_stream import Manifest, StreamingLoader
from zephon_stream.storage import copy_dataset
from zephon_stream.storage.node_cache import ENV_VAR
from zephon_stream.storage.schemes import THROTTLE_LIMITER_OPTION


def limiter_figures(manifest: Manifest, root: Path, args: argparse.Namespace, epoch_steps: int) -> dict:
    """Paired trials of the loader with and without the limiter on ``args.backend``; prints them as it goes."""
    with backend_server(args.backend) as (url, options, _, _, _), tempfile.TemporaryDirectory() as node:
        os.environ[ENV_VAR] = node
        copy_dataset(root, url, dst_options=options)
        variants = {"limiter": options, "off": {**options, THROTTLE_LIMITER_OPTION: False}}
        for name, opts in variants.items():
            with StreamingLoader(
                url, seq_len=args.seq_len, local_batch_size=args.local_batch, storage_options=opts
            ) as loader:
                limiter = loader._sources[0].store.limiter
                print(f"{name}: the store's limiter is {'the node' if limiter and limiter.shared else limiter}'s")
        trials = []
        for trial in range(args.trials):
            runs = {}
            for name in ("limiter", "off") if trial % 2 == 0 else ("off", "limiter"):
                opts = variants[name]
                rate = loader_tokens_per_s(url, opts, args, epoch_steps, passes=args.epochs)
                first = statistics.median(first_batch_s(url, opts, args, 0) for _ in range(args.repeats))
                runs[name] = {**rate, "first_batch_s": first, "load_1min": os.getloadavg()[0]}
            on, off = runs["limiter"], runs["off"]
            ratios = {
                "first_pass": on["tokens_per_s"] / off["tokens_per_s"],
                "steady": on.get("steady_tokens_per_s", 0) / off.get("steady_tokens_per_s", 1),
                "first_batch": on["first_batch_s"] / off["first_batch_s"],
            }
            trials.append({"limiter": on, "off": off, "ratios": ratios})
            print(
                f"trial {trial + 1}: limiter first pass {on['tokens_per_s'] / 1e6:.1f} M tok/s, steady "
                f"{on.get('steady_tokens_per_s', 0) / 1e6:.1f} M, first batch {on['first_batch_s'] * 1e3:.0f} ms; "
                f"off {off['tokens_per_s'] / 1e6:.1f} M, {off.get('steady_tokens_per_s', 0) / 1e6:.1f} M, "
                f"{off['first_batch_s'] * 1e3:.0f} ms; limiter / off: first pass {ratios['first_pass']:.2f}, "
                f"steady {ratios['steady']:.2f}, first batch {ratios['first_batch']:.2f}; load "
                f"{on['load_1min']:.1f}-{off['load_1min']:.1f}",
                flush=True,
            )
        del os.environ[ENV_VAR]
    summary = {key: [t["ratios"][key] for t in trials] for key in ("first_pass", "steady", "first_batch")}
    print("limiter / off over paired trials: " + ", ".join(f"{k} {spread(v)}" for k, v in summary.items()))
    return {
        "backend": args.backend,
        "trials": trials,
        "ratios": summary,
        "ratio_medians": {k: statistics.median(v) for k, v in summary.items()},
    }
