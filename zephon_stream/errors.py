"""Error classes. Each also inherits the built-in exception it means, so callers
that catch ``ValueError`` or ``FileNotFoundError`` keep working."""

from __future__ import annotations


class ZephonError(Exception):
    """Base class of every error raised on purpose by zephon_stream."""


class FormatError(ZephonError, ValueError):
    """Bytes that do not follow the format spec (docs/FORMAT.md)."""


class ManifestError(FormatError):
    """A manifest that cannot be decoded or fails validation."""


class VersionError(ManifestError):
    """A manifest or state written by an unknown major format version."""


class PathEscapeError(ManifestError):
    """A manifest path that is absolute, has a scheme, or climbs out with ``..``."""


class CorruptBlockError(FormatError):
    """A block whose checksum, frame or size does not match the manifest."""


class TruncatedObjectError(FormatError):
    """An object shorter than the manifest says it is."""


class IndexObjectError(FormatError):
    """An index object (format 1.1) that is truncated or whose bytes do not match their digests."""


class ObjectMissingError(ZephonError, FileNotFoundError):
    """An object the manifest names is not in the store."""


class StorageError(ZephonError, OSError):
    """A storage operation that still failed after every retry."""


class InputError(ZephonError, ValueError):
    """Writer input that cannot be read at all (not a per-record reject)."""


class ConfigError(ZephonError, ValueError):
    """A configuration that cannot work (bad sizes, memory cap too small...)."""


class StateMismatchError(ZephonError, ValueError):
    """A loader state that does not belong to this dataset or config."""


class TokenizerError(ZephonError, ValueError):
    """A tokenizer spec that cannot be loaded, or one that disagrees with a manifest."""


class HelperProcessError(ZephonError, RuntimeError):
    """The loader's helper process ended, or could not start, while the loader needed it."""


class EmptyDatasetError(InputError):
    """A conversion or merge that would commit a dataset holding no tokens (not asked for)."""
