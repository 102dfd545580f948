"""A ValidatingAdmissionPolicy decided as the real kube-apiserver decides it.

Used by the tests (tests/deploy/test_admission_policies.py) and by the API server stand-in
(``ApiServer.admit``), so both judge a request the same way. The evaluator is cel-python
(celpy, a development dependency: imported only here). What the real server does, and how this module makes
cel-python do the same:

* A missing map key or field is an error (cel-go: ``no such key: subResource``). cel-python
  0.5 raises ``CELEvalError`` ("no such key" / "no such member in mapping") too; this module
  turns any such error into an *error outcome*, never into a plain "false".
* ``has(x.f)`` tests presence without error; ``&&`` and ``||`` are commutative over errors
  (``error || true`` is true, ``error || false`` and ``error && true`` are errors), as in
  cel-go. cel-python 0.5 behaves so; tests/deploy/test_admission_policies.py pins it.
* Optional syntax (``x.?f``, ``m[?k]``, ``.orValue()``) works on the real server but cel-python
  cannot parse it: an expression using it is refused here with a message saying so, so the
  policies in deploy/ use ``has()`` (a silent mis-evaluation is not possible).
* The request is built as the server builds it: ``subResource`` is absent (not "") on a request
  to the main resource, ``userInfo.extra`` only holds what the token carries.
* Variables are evaluated in order; one that fails is kept as an error value that surfaces only
  in the expressions that use it (cel-go evaluates them lazily).
* Outcome: a matchCondition that is false means the policy does not apply; one that errors
  refuses the request (failurePolicy Fail). A validation that is false denies with its
  ``message``; one that errors denies with the server's "expression '...' resulted in error"
  text quoting the raw expression, which is what a policy must never produce.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import celpy
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

OPTIONAL_SYNTAX = re.compile(r"\.\?|\[\?|\.orValue\(|\.hasValue\(|optional\.")


@dataclass(frozen=True)
class Decision:
    allowed: bool
    message: str | None = None  # why denied: the policy's message, or the error text
    error: bool = False  # denied because an expression failed (not by a false validation)


def request(
    operation: str, *, node: str | None, sub: str | None = None, user: str
) -> dict[str, Any]:
    """An admission request's ``request`` as the real server gives it to CEL."""
    req: dict[str, Any] = {"operation": operation, "userInfo": {"username": user}}
    if node is not None:
        req["userInfo"]["extra"] = {"authentication.kubernetes.io/node-name": [node]}
    if sub:
        req["subResource"] = sub
    return req


def _substring(text: Any, start: Any, end: Any = None) -> Any:
    """Kubernetes CEL's strings extension ``<string>.substring(start[, end])`` (cel-python has
    no extension library): an index out of range is an error, as on the real server."""
    n = len(text)
    stop = n if end is None else int(end)
    if not 0 <= int(start) <= stop <= n:
        raise ValueError(f"substring: index out of range: {start}, {stop} of {n}")
    return celpy.celtypes.StringType(str(text)[int(start) : stop])


# the functions of Kubernetes' CEL libraries a policy here uses that cel-python lacks
K8S_FUNCTIONS: dict[str, Any] = {"substring": _substring}


class Policy:
    def __init__(self, policy: dict[str, Any]) -> None:
        self.spec = policy["spec"]
        self.env = celpy.Environment()
        self._programs: dict[str, Any] = {}
        for expression in self._expressions():
            if OPTIONAL_SYNTAX.search(expression):
                raise ValueError(
                    f"cel-python cannot evaluate optional syntax; use has() instead: {expression}"
                )
            self._programs[expression] = self.env.program(
                self.env.compile(expression), functions=K8S_FUNCTIONS
            )

    def _expressions(self) -> list[str]:
        spec = self.spec
        return [
            e["expression"]
            for key in ("matchConditions", "variables", "validations")
            for e in spec.get(key, [])
        ]

    def _eval(self, expression: str, activation: dict[str, Any]) -> Any:
        try:
            return self._programs[expression].evaluate(activation)
        except CELEvalError as exc:
            return exc

    def decide(self, req: dict[str, Any], obj: Any, old: Any) -> Decision:
        activation: dict[str, Any] = {
            "request": json_to_cel(req),
            "object": json_to_cel(obj),
            "oldObject": json_to_cel(old),
        }
        for condition in self.spec.get("matchConditions", []):
            value = self._eval(condition["expression"], activation)
            if isinstance(value, CELEvalError):
                return Decision(False, f"matchCondition {condition['name']}: {_text(value)}", True)
            if value is celpy.celtypes.BoolType(False) or value == celpy.celtypes.BoolType(False):
                return Decision(True)  # not the exporter: the policy does not apply
        variables: dict[Any, Any] = {}
        activation["variables"] = celpy.celtypes.MapType(variables)
        for variable in self.spec.get("variables", []):
            variables[celpy.celtypes.StringType(variable["name"])] = self._eval(
                variable["expression"], activation
            )
            activation["variables"] = celpy.celtypes.MapType(variables)
        for validation in self.spec["validations"]:
            expression = validation["expression"]
            value = self._eval(expression, activation)
            if isinstance(value, CELEvalError):
                return Decision(
                    False, f"expression '{expression}' resulted in error: {_text(value)}", True
                )
            if not isinstance(value, celpy.celtypes.BoolType):
                return Decision(False, f"expression '{expression}' is not a bool: {value!r}", True)
            if not value:
                message = " ".join(str(validation.get("message") or "").split())
                return Decision(False, message or f"failed expression: {expression}")
        return Decision(True)


def _text(error: CELEvalError) -> str:
    """cel-python's error as cel-go words it for a missing key."""
    args = error.args
    if args and isinstance(args[0], str) and args[0].startswith(("no such key", "no such member")):
        key = args[2][0] if len(args) > 2 and args[2] else args[0].rpartition(":")[2].strip(" '")
        return f"no such key: {key}"
    return " ".join(str(error).split())
