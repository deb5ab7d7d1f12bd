"""lorasink's Python client: Client for every route, LorasinkError for
every refusal, and (with torch) lorasink.torch for a transformers model
whose shared experts run on the server."""
from .client import Client
from .errors import LorasinkError

__all__ = ["Client", "LorasinkError", "__version__"]
__version__ = "0.1.0"
