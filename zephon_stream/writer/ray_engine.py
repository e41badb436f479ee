"""``write_dataset(..., engine="ray")``: the conversion as Ray tasks, committed by the driver.

The run, in order: expand the inputs and cut them into work units
(``units.py``; newlines before each byte range counted by tasks); look up
which units a previous run completed (their commit records hold this run's
key); convert the others, one task each, at most ``workers`` at once, in any
order (a task whose worker dies is retried by Ray and rewrites the same
objects); once every unit is complete, the driver commits: one manifest over
every part in input order (``ray_commit.py``). A run killed before that
leaves no manifest, and running it again converts only what was not complete.

Without an address, a local Ray instance sized to this machine is started and
stopped by the run; with one (``ray://`` or ``HOST:PORT``, or ``auto``) the
run joins that cluster, whose nodes need this package installed. A process
already connected to Ray (``ray.is_initialized()``) is used as it is.
Ray's usage reporting is off.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from zephon_stream.errors import ConfigError, ZephonError
from zephon_stream.storage import Store
from zephon_stream.storage.lifetime import OWNER_FILE, mark_owner, sweep_orphaned
from zephon_stream.writer.config import DEFAULT_UNIT_BYTES, WriteConfig
from zephon_stream.writer.distributed import part_name
from zephon_stream.writer.output import prepare_output
from zephon_stream.writer.progress import UnitProgress, WriteSummary
from zephon_stream.writer.ray_commit import commit_units, complete_units
from zephon_stream.writer.ray_tasks import convert_unit_task, count_lines_task
from zephon_stream.writer.tokenizers import Tokenizer
from zephon_stream.writer.unit_part import UnitRecord, UnitSpec
from zephon_stream.writer.units import WorkUnit, cut_units, unit_key

# Ray retries a task whose worker process died (a node lost, the OOM
# killer); an error the task raised itself (unreadable input) is not retried.
TASK_MAX_RETRIES = 3
LINE_COUNT_BATCH = 64
MAX_TEMP_ROOT_CHARS = 24
SESSION_DIR_PREFIX = "zs-ray-"
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
# The warning Ray 2.60 logs when it turns token authentication on for a new local instance.
AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
AUTH_ON_WARNING = "Token authentication is enabled for this Ray cluster"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("engine='ray' needs Ray: pip install 'zephon-stream[ray]'") from None
    return ray


@contextmanager
def ray_session(address: str | None, *, num_cpus: int | None = None) -> Iterator[Any]:
    """Ray, connected: to ``address``, or to a local instance started here and stopped after.

    A process already connected is left connected. The local instance keeps
    its session files in a temporary folder, removed after a run that
    succeeded (kept after a failure: its workers' logs). While the run
    lasts the folder names its owner: the folder of a run that was killed
    is removed by the next run's start (``lifetime.sweep_orphaned``).
    """
    ray = _import_ray()
    if ray.is_initialized():
        yield ray
        return
    # Nothing but loopback may be reachable, and a user's corpus is no one else's business.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        ray.init(address=address, log_to_driver=False)
        try:
            yield ray
        finally:
            ray.shutdown()
        return
    # Ray starts workers at niceness 15 (RAY_worker_niceness) to keep
    # its own daemons responsive on shared nodes; a command that owns its
    # instance tokenizes at the niceness of the process pool's workers, so
    # that any other process on the machine does not come first.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # The local instance's session folder (logs, sockets) goes once the
    # run has succeeded; after a failure it stays, for its workers' logs.
    session_dir = None
    if "RAY_TMPDIR" not in os.environ:
        root = _short_temp_root()
        sweep_orphaned(root, (SESSION_DIR_PREFIX,))
        session_dir = tempfile.mkdtemp(prefix=SESSION_DIR_PREFIX, dir=root)
        mark_owner(session_dir)
    auth = _OwnToken(session_dir)
    try:
        with _dropped(logging.getLogger(AUTH_LOGGER), AUTH_ON_WARNING):
            ray.init(
                num_cpus=num_cpus or os.cpu_count() or 1,
                include_dashboard=False,
                log_to_driver=False,
                _temp_dir=session_dir,
            )
    except BaseException:
        auth.close()
        if session_dir is not None:
            shutil.rmtree(session_dir, ignore_errors=True)
        raise
    succeeded = False
    try:
        yield ray
        succeeded = True
    finally:
        ray.shutdown()
        auth.close()
        if session_dir is not None:
            if succeeded:
                shutil.rmtree(session_dir, ignore_errors=True)
            else:
                # Kept on purpose, for its logs: no longer the sweep's to take.
                Path(session_dir, OWNER_FILE).unlink(missing_ok=True)


class _OwnToken:
    """A local instance's own authentication token, in force while it runs.

    Ray 2.60 turns token authentication on for every new local
    instance, says so in a warning, and, with no token given, writes one to
    ``~/.ray/auth_token``, which from then on turns authentication on for
    every Ray process of the user (a ``ray start`` of theirs included). A
    token of the instance's own (``RAY_AUTH_TOKEN_PATH``, mode 0600) keeps the
    authentication and leaves the user's home as it was. A user who set any
    of ``AUTH_ENV`` keeps their choice.
    """

    def __init__(self, folder: str | None) -> None:
        self._saved: dict[str, str | None] | None = None
        self._folder: str | None = None
        self._path: str | None = None
        if any(name in os.environ for name in AUTH_ENV):
            return
        self._folder = None if folder is not None else tempfile.mkdtemp(prefix=SESSION_DIR_PREFIX)
        self._path = os.path.join(folder or self._folder, "auth_token")
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as token:
            # os.urandom, not the secrets module, which a script's own secrets.py may shadow.
            token.write(os.urandom(32).hex())
        self._saved = {name: os.environ.get(name) for name in AUTH_ENV}
        os.environ["RAY_AUTH_TOKEN_PATH"] = self._path

    def close(self) -> None:
        """Put the environment back (Ray sets ``RAY_AUTH_MODE`` itself) and remove the token."""
        if self._saved is not None:
            for name, value in self._saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            self._saved = None
        if self._path is not None:
            Path(self._path).unlink(missing_ok=True)
            self._path = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


class _DropMessage(logging.Filter):
    """Drops the records whose message starts with ``prefix``; every other record passes."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


@contextmanager
def _dropped(logger: logging.Logger, prefix: str) -> Iterator[None]:
    """While the block runs, ``logger`` drops the one message that starts with ``prefix``."""
    quiet = _DropMessage(prefix)
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _short_temp_root() -> str:
    """The temporary folder, or ``/tmp`` where it is too long for Ray's sockets.

    Ray puts its Unix sockets about 80 bytes deep in its session
    folder, and a socket path may not exceed 107 bytes.
    """
    root = tempfile.gettempdir()
    return root if len(root) <= MAX_TEMP_ROOT_CHARS or not os.path.isdir("/tmp") else "/tmp"


def _task_error(ray: Any, exc: BaseException) -> BaseException:
    """The error a task raised, without Ray's wrapping (its message names the input and offset)."""
    cause = getattr(exc, "cause", None)
    if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(cause, BaseException):
        return cause
    return exc


def check_engine(engine: str, *, address: str | None, workers: int | None) -> None:
    """Refuse an unknown engine, and Ray's settings given to the process pool."""
    if engine not in ("pool", "ray"):
        raise ConfigError(f"engine {engine!r} is not one of pool, ray")
    if engine == "pool" and (address is not None or workers is not None):
        raise ConfigError("ray_address and ray_workers apply to engine='ray' only")


def write_with_ray(
    urls: Sequence[str],
    store: Store,
    *,
    config: WriteConfig,
    tokenizer: Tokenizer,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    address: str | None = None,
    workers: int | None = None,
    unit_bytes: int = DEFAULT_UNIT_BYTES,
    submit_order: Sequence[int] | None = None,
) -> WriteSummary:
    """Convert ``urls`` (expanded, in order) into the dataset at ``store`` with Ray tasks.

    Args:
        urls: the inputs, in input order.
        store: the output root.
        config: the run's resolved settings.
        tokenizer: the loaded tokenizer.
        storage_options: fsspec options for inputs and output.
        progress: show a progress bar (default: only on a terminal).
        address: a Ray cluster to join (default: start a local instance).
        workers: units converted at once (default: the cluster's CPUs).
        unit_bytes: stored input bytes a work unit aims at.
        submit_order: unit indices in the order to submit them (default:
            input order); the output is the same for any order.

    Raises:
        InputError: an input that cannot be read (the other units' parts are kept).
        ConfigError: a dataset already at the output (without overwrite).
    """
    start = time.monotonic()
    if config.workers != 1:
        raise ConfigError(f"workers={config.workers} sizes the process pool; with engine='ray' set ray_workers instead")
    prepare_output(store, overwrite=config.overwrite)
    assert config.blocks_per_shard is not None
    with ray_session(address, num_cpus=workers) as ray:
        in_flight_max = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        count = ray.remote(num_cpus=1, max_retries=TASK_MAX_RETRIES)(count_lines_task)

        def line_counter(requests: Sequence[tuple[str, int, int]]) -> list[int]:
            batches = [list(requests[i : i + LINE_COUNT_BATCH]) for i in range(0, len(requests), LINE_COUNT_BATCH)]
            results = _get(ray, [count.remote(batch, storage_options) for batch in batches])
            return [n for batch in results for n in batch]

        units = cut_units(
            urls, config=config, unit_bytes=unit_bytes, storage_options=storage_options, line_counter=line_counter
        )
        spec = UnitSpec(output=store.url, config=config, tokenizer=tokenizer, storage_options=storage_options)
        settings = spec.settings()
        names = [part_name(u.index, len(units)) for u in units]
        keys = [unit_key(u, settings) for u in units]
        found = complete_units(store, names, keys)
        bar = UnitProgress(enabled=progress, total_units=len(units))
        try:
            for counts in found:
                if counts is not None:
                    bar.unit_done(records=counts[0], tokens=counts[1])
            order = list(submit_order) if submit_order is not None else list(range(len(units)))
            if sorted(order) != list(range(len(units))):
                raise ConfigError(f"submit_order must be a permutation of the {len(units)} unit indices")
            todo = [units[i] for i in order if found[i] is None]
            _run_tasks(ray, todo, spec, names, keys, in_flight_max, bar)
        finally:
            bar.close()
    manifest, totals = commit_units(
        store,
        names,
        tokenizer=tokenizer.identity(),
        block_tokens=config.block_tokens,
        blocks_per_shard=config.blocks_per_shard,
        keys=keys,
        allow_empty=config.allow_empty,
    )
    return WriteSummary.of(
        manifest,
        rejected=totals.rejected,
        output=store.url,
        records_in=totals.records_in,
        records_written=totals.records_written,
        input_bytes=totals.input_bytes,
        seconds=time.monotonic() - start,
        tokenizer_processes=in_flight_max,
        num_units=len(units),
        units_reused=sum(c is not None for c in found),
    )


def _get(ray: Any, refs: list[Any]) -> list[Any]:
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        raise _task_error(ray, exc) from None


def _run_tasks(
    ray: Any,
    todo: list[WorkUnit],
    spec: UnitSpec,
    names: list[str],
    keys: list[str],
    in_flight_max: int,
    bar: UnitProgress,
) -> None:
    """Convert ``todo`` with at most ``in_flight_max`` tasks at once; on a failure, finish those running, then raise."""
    remote = ray.remote(num_cpus=1, max_retries=TASK_MAX_RETRIES)(convert_unit_task)
    # Boxed, so that Ray hands each task the ref and a worker resolves it once a run (ray_tasks.py).
    spec_box = [ray.put(spec)]
    pending = list(reversed(todo))
    running: list[Any] = []
    failure: BaseException | None = None
    while running or (pending and failure is None):
        while pending and failure is None and len(running) < in_flight_max:
            unit = pending.pop()
            running.append(remote.remote(unit, spec_box, names[unit.index], keys[unit.index]))
        done, running = ray.wait(running, num_returns=1)
        try:
            record: UnitRecord = ray.get(done[0])
        except (ray.exceptions.RayError, ZephonError) as exc:
            # The units already running finish and stay complete for the rerun.
            failure = failure or _task_error(ray, exc)
            continue
        bar.unit_done(records=record.num_records, tokens=record.num_tokens)
    if failure is not None:
        raise failure
