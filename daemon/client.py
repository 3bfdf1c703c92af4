"""The old import path of the SDK, kept as an alias: use `zerolayer.client`."""
from zerolayer.client import *  # noqa: F401,F403
from zerolayer.client import __all__  # noqa: F401
