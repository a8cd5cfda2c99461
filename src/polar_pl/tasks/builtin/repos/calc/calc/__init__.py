"""calc: evaluate arithmetic expressions safely (no eval)."""

from calc.errors import CalcError
from calc.evaluate import evaluate

__all__ = ["CalcError", "evaluate"]
