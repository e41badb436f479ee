"""plan/ and format/ stay pure: they import with torch and fsspec unavailable."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"torch", "fsspec", "s3fs", "boto3", "botocore"}:
                raise ImportError(f"blocked import of {name}")
            return None

    sys.meta_path.insert(0, Block())
    """
)


@pytest.mark.parametrize("module", ["zephon_stream.plan", "zephon_stream.format"])
def test_pure_packages_import_without_torch_or_fsspec(module):
    code = BLOCKER + textwrap.dedent(
        f"""
        import importlib, pkgutil
        package = importlib.import_module({module!r})
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module({module!r} + "." + info.name)
        try:
            import torch
        except ImportError:
            pass
        else:
            raise SystemExit("the blocker did not block torch")
        assert not any(m.split(".")[0] in {{"torch", "fsspec"}} for m in sys.modules)
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
