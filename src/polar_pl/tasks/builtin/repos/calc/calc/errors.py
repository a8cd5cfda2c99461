class CalcError(Exception):
    """Any problem with an expression: syntax, unknown names, arithmetic."""
