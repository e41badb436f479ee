"""Ray across the nodes of a box: a conversion from the store into the store survives a node cut off mid-run.

A Ray head on node 0 and workers joining it from nodes 1 and 2 (``ray start --address``), one CPU each,
token authentication, the head's health checks tightened (``RAY_health_check_*``: a node that answers none
for about 3 s is dead). ``zephon-stream write --engine ray --ray-address`` runs on node 0 and converts a corpus
of every input kind (small files, a JSONL file cut into ranges, a gzip stream, Parquet row groups) from the
store into the store. First uninterrupted, then again with node 2's link cut while it converts a unit: that
unit runs again on another node (its inputs are read again from another node's address, and nothing comes
from node 2 after the cut), and the dataset is byte-identical, object for object, to the uninterrupted run's,
whose contents are the single-process writer's.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster_helpers import needs_box
from fixtures_ray import RAY_BLOCK_TOKENS, RAY_BLOCKS_PER_SHARD, RAY_UNIT_BYTES, assert_same_contents, dataset_contents
from tools.cluster_box import Box
from zephon_stream import write_dataset
from zephon_stream.storage import open_store

RAY_PORT = 6379
# A node that answers no health check for period x threshold is dead (Ray's defaults: 3 s x 5).
HEALTH = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "RAY_grpc_client_keepalive_time_ms": "1000",
    "RAY_grpc_client_keepalive_timeout_ms": "2000",
    "RAY_grpc_keepalive_time_ms": "1000",
    "RAY_grpc_keepalive_timeout_ms": "2000",
}
READY = """
import sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.monotonic() + 120
while sum(n["Alive"] for n in ray.nodes()) < int(sys.argv[2]):
    assert time.monotonic() < deadline, ray.nodes()
    time.sleep(0.2)
"""


def _ray_env(box: Box) -> dict[str, str]:
    token = box.shared / "ray-token"
    if not token.exists():
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
    # A cluster across addresses: the loopback-only switch the session's own head sets must not be off here.
    return {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
        "RAY_worker_niceness": "0",
        **HEALTH,
    }


def _start_cluster(box: Box) -> str:
    head = f"{box.nodes[0].address}:{RAY_PORT}"
    common = ["--block", "--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats"]
    for node in box.nodes:
        role = [f"--address={head}"]
        if node.index == 0:
            role = ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"]
        with open(box.shared / f"ray-{node.hostname}.log", "wb") as log:
            box.run(
                node.index,
                ["ray", "start", *role, f"--node-ip-address={node.address}", *common],
                env=_ray_env(box),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        if node.index == 0:
            time.sleep(2)  # The workers retry their connection to the head, but more slowly than it starts
    box.check_output(0, [sys.executable, "-c", READY, head, str(len(box.nodes))], env=_ray_env(box), timeout_s=180)
    return head


def _convert(box: Box, head: str, inputs: list[str], output: str, tokenizer: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "zephon_stream",
        "write",
        *inputs,
        "-o",
        output,
        "--tokenizer",
        tokenizer,
        "--engine",
        "ray",
        "--ray-address",
        head,
        "--unit-bytes",
        str(RAY_UNIT_BYTES),
        "--block-tokens",
        str(RAY_BLOCK_TOKENS),
        "--blocks-per-shard",
        str(RAY_BLOCKS_PER_SHARD),
        "--json",
        "--no-progress",
    ]
    return box.run(0, command, env=_ray_env(box), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _converting(box: Box, node: int) -> bool:
    for pid in box.pids(node):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::convert_unit_task"):
                return True
        except OSError:
            continue
    return False


def _objects(url: str, options: dict) -> dict[str, bytes]:
    with open_store(url, options) as store:
        return {path: store.read(path) for path in sorted(store.list())}


@pytest.mark.slow
@needs_box
def test_a_conversion_on_three_nodes_loses_one_mid_run_and_writes_the_same_bytes(ray_inputs, bpe_tokenizer_json):
    times: dict[str, float] = {}
    with Box(3) as box:
        options = box.store.direct_options()
        inputs = []
        with open_store("s3://data/corpus", options) as corpus:
            for path in ray_inputs.paths:
                corpus.write_atomic(Path(path).name, Path(path).read_bytes())
                inputs.append(f"s3://data/corpus/{Path(path).name}")
        tokenizer = box.shared / "tokenizer.json"
        tokenizer.write_bytes(bpe_tokenizer_json.read_bytes())
        started = time.time()
        head = _start_cluster(box)
        times["cluster_up_s"] = time.time() - started

        began = time.time()
        whole = _convert(box, head, inputs, "s3://data/whole", f"hf:{tokenizer}")
        out, err = whole.communicate(timeout=300)
        assert whole.returncode == 0, err[-3000:]
        times["uninterrupted_s"] = time.time() - began
        summary = json.loads(out.strip().splitlines()[-1])

        node2 = box.nodes[2].address
        began = time.time()
        cut_run = _convert(box, head, inputs, "s3://data/out", f"hf:{tokenizer}")

        def node2_reads() -> set[str]:
            return {
                r.key
                for r in box.store.requests()
                if r.client == node2 and r.method == "GET" and "/corpus/" in r.key and r.when > began
            }

        # mid-unit: node 2 runs a conversion task and has read its inputs
        while not (_converting(box, 2) and node2_reads()):
            assert cut_run.poll() is None and time.time() - began < 120, "node 2 converted nothing"
            time.sleep(0.02)
        read_by_node2 = node2_reads()
        cut = time.time()
        box.cut(2)
        out, err = cut_run.communicate(timeout=300)
        times["cut_run_s"], times["cut_to_end_s"] = time.time() - began, time.time() - cut
        assert cut_run.returncode == 0, err[-3000:]
        requests = box.store.requests()
        whole_objects = _objects("s3://data/whole", options)
        cut_objects = _objects("s3://data/out", options)
        write_dataset(
            inputs,
            "s3://data/pool",
            tokenizer=f"hf:{bpe_tokenizer_json}",
            block_tokens=RAY_BLOCK_TOKENS,
            blocks_per_shard=RAY_BLOCKS_PER_SHARD,
            storage_options=options,
            progress=False,
        )
        pool = dataset_contents("s3://data/pool", options)
        converted = dataset_contents("s3://data/out", options)
    print(json.dumps({**{k: round(v, 1) for k, v in times.items()}, "units": summary["num_units"]}))

    assert summary["num_units"] >= 6 and json.loads(out.strip().splitlines()[-1])["num_units"] == summary["num_units"]
    # node 2's unit ran again elsewhere: what it had read of the corpus was read again from another node
    reread = {r.key for r in requests if r.client != node2 and r.method == "GET" and r.when > cut}
    assert read_by_node2 <= reread, (read_by_node2, reread)
    assert cut_objects == whole_objects
    assert_same_contents(converted, pool)
