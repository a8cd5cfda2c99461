"""Evaluate an expression string."""

import math

from calc.errors import CalcError
from calc.parser import parse
from calc.tokens import tokenize

CONSTANTS = {"pi": math.pi, "e": math.e}


def evaluate(text, variables=None):
    names = dict(CONSTANTS)
    names.update(variables or {})
    return _eval(parse(tokenize(text)), names)


def _eval(node, names):
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "name":
        return names[node[1]]
    if kind == "neg":
        return -_eval(node[1], names)
    left = _eval(node[1], names)
    right = _eval(node[2], names)
    if kind == "+":
        return left + right
    if kind == "-":
        return left - right
    if kind == "*":
        return left * right
    if kind == "/":
        return left / right
    if kind == "^":
        return left**right
    raise CalcError(f"unknown node {kind!r}")
