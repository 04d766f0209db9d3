"""sensprof: measure how much each layer's Key and Value cache can be quantized, then plan and serve it."""

__version__ = "0.1.0"

from ._aliases import install_aliases
from .errors import SensprofError
from .schemes import QuantScheme, get_scheme

__all__ = ["QuantScheme", "SensprofError", "__version__", "get_scheme"]

install_aliases()  # the moved modules' old names (sensprof.planner, sensprof.validate, ...): sensprof/_aliases.py
