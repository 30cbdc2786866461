"""sparsespec: SparseSpec-L self-speculative decoding and the baselines it is judged against."""
from .decode import generate, prefill
from .errors import ConfigError, UnavailableError
from .generation import Generation, Round
from .methods import METHODS, method_names

__all__ = ["generate", "prefill", "Generation", "Round", "METHODS", "method_names", "ConfigError", "UnavailableError"]
