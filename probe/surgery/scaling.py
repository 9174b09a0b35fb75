"""Residual branch scaling: y = x + alpha f(x) in every layer (Noci et al. 2022).

Noci et al. (NeurIPS 2022, "Signal propagation in transformers") show that at random init
the tokens of a deep transformer align with depth (rank collapse), and that multiplying
each residual branch by alpha = 1/sqrt(L) before its addition keeps them apart.  Here each
layer's attention branch and MLP branch, as they are added to the residual stream, are
multiplied by alpha; everything else (the norms, the embeddings) is unchanged.  In a
post-LN layer the scaled branch is added before the norm: N(x + alpha f(x)).

alpha is a number (``0.5``) or an expression of the depth L, written as on paper:
``1/sqrt(L)``, ``1/L``, ``L^-0.5``, ``2/sqrt(2*L)``.  :func:`parse_branch_scale` reads it
through a tiny parser of its own (Python's ``ast`` of the text, with numbers, ``L``,
``+ - * / ^ **``, parentheses, ``sqrt``, ``log`` and ``exp`` allowed and nothing else;
no ``eval``); :meth:`BranchScale.value` evaluates it at a model's depth.  alpha = 1 is
no step at all: the model runs exactly as without scaling.

The walker performs the scaling as steps (:meth:`probe.models.spec.SpecAdapter.walk`):
the attention branch where the family's entry reads it, the MLP branch where the entry's
``mlp_branch`` says it leaves the MLP; each product is formed once, ``branch * alpha`` in
the model's dtype, exactly as a hand-written module surgery forms it.
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass

from probe.errors import ProbeError
from probe.requests.checks import plain

#: Longest expression accepted (a typo, not a formula, beyond that).
MAX_TEXT = 100
#: Functions an expression may call, of one argument.
FUNCTIONS = {"sqrt": math.sqrt, "log": math.log, "exp": math.exp}
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_SYNTAX = "a number (0.5) or an expression of the depth L such as 1/sqrt(L), 1/L or L^-0.5"


@dataclass(frozen=True)
class BranchScale:
    """A residual branch scale alpha: a number or an expression of the depth L.

    Made by `probe.surgery.scaling.parse_branch_scale` from a number or a text such as
    `"1/sqrt(L)"`; `value(n_layers)` is alpha at a given depth.

    Parameters
    ----------
    text
        alpha as written, normalised: no spaces, `^` for powers.
    """

    text: str
    _tree: ast.expr

    @property
    def is_one(self) -> bool:
        """alpha is the number 1 whatever the depth: no scaling step at all."""
        return isinstance(self._tree, ast.Constant) and float(self._tree.value) == 1.0

    @property
    def depends_on_depth(self) -> bool:
        return any(isinstance(node, ast.Name) for node in ast.walk(self._tree))

    def value(self, n_layers: int) -> float:
        """alpha for a model of ``n_layers`` layers: a finite positive float, or ProbeError."""
        try:
            alpha = float(_evaluate(self._tree, float(n_layers)))
        except (ArithmeticError, ValueError, TypeError):  # 1/(L-1) at L=1, log(0), overflow
            alpha = math.nan
        if not self.depends_on_depth and not (math.isfinite(alpha) and alpha > 0):
            raise ProbeError(f"`branch_scale` must be a finite positive number, got {self.text}")
        if not math.isfinite(alpha) or alpha <= 0:
            raise ProbeError(
                f"`branch_scale` {self.text} is {alpha:g} at depth L={n_layers}; "
                "it must be a finite positive number there"
            )
        return alpha

    def __str__(self) -> str:
        return self.text


def parse_branch_scale(text) -> BranchScale:
    """``0.5``, ``1/sqrt(L)``, ``L^-0.5``, ... (or a number, or a BranchScale) -> a BranchScale.

    Refused in one line: an empty text, anything but numbers, ``L``, the four operations,
    powers, parentheses and ``sqrt``/``log``/``exp``, and a value that is not finite and
    positive at L = 1 (a constant) or at some depth (an expression that never is).  A numpy
    scalar is read as the Python number it holds."""
    text = plain(text)
    if isinstance(text, BranchScale):
        return text
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ProbeError(f"`branch_scale` takes {_SYNTAX}; got {type(text).__name__}")
    if isinstance(text, int | float):
        if not math.isfinite(text) or text <= 0:
            raise ProbeError(f"`branch_scale` must be a finite positive number, got {text!r}")
        text = repr(float(text)) if isinstance(text, float) else str(text)
    shown = " ".join(text.split())
    if not shown or len(shown) > MAX_TEXT or "\0" in shown:
        what = "empty" if not shown else f"{shown[:MAX_TEXT]!r}..."
        raise ProbeError(f"`branch_scale` is {what}; give {_SYNTAX}")
    try:
        tree = ast.parse(shown.replace("^", "**"), mode="eval").body
        _check(tree)
    except (SyntaxError, ValueError) as err:
        why = str(err) if isinstance(err, ValueError) else "it is not an expression"
        raise ProbeError(f"`branch_scale` {shown!r}: {why}; give {_SYNTAX}") from None
    normal = ast.unparse(tree).replace("**", "^").replace(" ", "")
    scale = BranchScale(normal, tree)
    # Some depth must give a valid alpha (1..4096 covers every model that fits a machine).
    for depth in (1, 2, 12, 4096):
        try:
            scale.value(depth)
            break
        except ProbeError:
            continue
    else:
        scale.value(1)  # raises: the line says the value
    return scale


def _check(node: ast.AST) -> None:
    """Only numbers, ``L``, + - * / **, unary signs and sqrt/log/exp of one argument."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ValueError(f"{node.value!r} is not a number")
        return
    if isinstance(node, ast.Name):
        if node.id != "L":
            raise ValueError(f"unknown name {node.id!r} (L is the depth)")
        return
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        _check(node.left)
        _check(node.right)
        return
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        _check(node.operand)
        return
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in FUNCTIONS
        and len(node.args) == 1
        and not node.keywords
    ):
        _check(node.args[0])
        return
    raise ValueError(f"{ast.unparse(node)!r} is not allowed")


def _evaluate(node: ast.AST, depth: float) -> float:
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        return depth
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, depth), _evaluate(node.right, depth)
        if isinstance(node.op, ast.Pow) and abs(right) > 1e3:  # 2^1e9: not a scale
            raise OverflowError
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_evaluate(node.operand, depth))
    return FUNCTIONS[node.func.id](_evaluate(node.args[0], depth))  # type: ignore[attr-defined]


#: No scaling: every result without a branch scale.
ONE = parse_branch_scale("1")
