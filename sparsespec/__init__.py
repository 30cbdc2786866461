"""sparsespec: SparseSpec-L self-speculative decoding and the baselines it is judged against."""
from sparsespec.api import generate, prefill
from sparsespec.call_memory import forget
from sparsespec.errors import ConfigError, UnavailableError
from sparsespec.engine.generation import Generation, Round
from sparsespec.methods import METHODS, method_names

__all__ = ["generate", "prefill", "forget", "Generation", "Round", "METHODS", "method_names", "ConfigError", "UnavailableError"]
