"""One line for a YAML syntax error, the same in every file gpuquota reads (a web config, a
health config, a rate card): where it is and what is wrong, never PyYAML's five-line excerpt."""

from __future__ import annotations

import yaml


def yaml_position(exc: yaml.YAMLError) -> str | None:
    """``line L`` of the error, where PyYAML knows it."""
    mark = getattr(exc, "problem_mark", None)
    return None if mark is None else f"line {mark.line + 1}"


def yaml_problem(exc: yaml.YAMLError, *, position: bool = True) -> str:
    """``line L, column C: PROBLEM (CONTEXT)`` on one line (without the position if asked)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or (str(exc).strip().splitlines() or ["error"])[0]
    context = getattr(exc, "context", None)
    text = " ".join(str(f"{problem} ({context})" if context else problem).split())
    if mark is None or not position:
        return text
    return f"line {mark.line + 1}, column {mark.column + 1}: {text}"
