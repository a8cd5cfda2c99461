"""Recursive-descent parser producing a small tuple AST.

Grammar:
    expr   := term (("+" | "-") term)*
    term   := unary (("*" | "/") unary)*
    unary  := "-" unary | power
    power  := atom ("^" unary)?
    atom   := number | name | "(" expr ")"
"""

from calc.errors import CalcError


class Parser:
    def __init__(self, tokens):
        self.tokens = tokens
        self.pos = 0

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else (None, None)

    def take(self):
        tok = self.peek()
        self.pos += 1
        return tok

    def expect(self, value):
        _, got = self.take()
        if got != value:
            raise CalcError(f"expected {value!r}, got {got!r}")

    def parse(self):
        if not self.tokens:
            raise CalcError("empty expression")
        node = self.expr()
        if self.pos != len(self.tokens):
            raise CalcError(f"unexpected {self.peek()[1]!r}")
        return node

    def expr(self):
        left = self.term()
        value = self.peek()[1]
        if value == "+":
            self.take()
            return ("+", left, self.expr())
        if value == "-":
            self.take()
            return ("-", left, self.expr())
        return left

    def term(self):
        node = self.unary()
        while self.peek()[1] in ("*", "/"):
            op = self.take()[1]
            node = (op, node, self.unary())
        return node

    def unary(self):
        if self.peek()[1] == "-":
            self.take()
            return ("neg", self.unary())
        return self.power()

    def power(self):
        node = self.atom()
        while self.peek()[1] == "^":
            self.take()
            node = ("^", node, self.atom())
        return node

    def atom(self):
        kind, value = self.take()
        if kind == "num":
            return ("num", value)
        if kind == "name":
            return ("name", value)
        if value == "(":
            node = self.expr()
            self.expect(")")
            return node
        raise CalcError(f"unexpected {value!r}" if value is not None else "unexpected end of input")


def parse(tokens):
    return Parser(tokens).parse()
