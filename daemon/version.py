"""The version both commands print (--version): the installed package's, from setup.cfg."""
from __future__ import annotations


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("zerolayer")
    except PackageNotFoundError:  # a source tree that was never installed
        from zerolayer.gpu import __version__
        return __version__
