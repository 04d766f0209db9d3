"""sensprof: measure how much each layer's Key and Value cache can be quantized, then plan and serve it."""

__version__ = "0.1.0"

from .errors import SensprofError  # noqa: E402
from .schemes import QuantScheme, get_scheme  # noqa: E402

__all__ = ["SensprofError", "QuantScheme", "get_scheme", "__version__"]
