"""What a conformance rule is, and how a family module declares one.

A family module declares each rule with :func:`rule` right above the function that checks it.
The decorator holds the rule's name, the capability level it needs and its one-sentence
description, and the stores it applies to.
The function's docstring says what exactly the rule checks.
So each rule is written in one place.
The package builds :data:`ptb_fence.conformance.RULES` and the rule list of its documentation
from these declarations.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from ptb_fence.conformance._probe import Probe

LEVELS: Tuple[str, ...] = ("base", "fenced", "durable")
"""The capability levels, each including the ones before it."""

_EVERY: Dict[str, str] = {
    "base": "every store",
    "fenced": "every fenced store",
    "durable": "every durable store",
}

RuleFunction = Callable[[Probe, bool, bool], None]
"""A rule's check.

It is called with the probe of a fresh store and whether the store is fenced and durable.
It reports through the probe and returns nothing.
"""


@dataclass(frozen=True)
class ConformanceRule:
    """One rule of the conformance check.

    Args:
        name (:obj:`str`): The stable rule name that prefixes its violations, e.g. ``"lease"``.
        level (:obj:`str`): The capability level the rule needs: ``"base"``, ``"fenced"`` or
            ``"durable"``.
        description (:obj:`str`): What the rule checks, in one sentence.
    """

    name: str
    level: str
    description: str


@dataclass(frozen=True)
class RuleCheck:
    """A declared rule.

    It holds the public :class:`ConformanceRule`, the stores the rule applies to, what it checks in
    detail (reStructuredText) and the function that checks it.
    """

    rule: ConformanceRule
    applies: str
    details: str
    run: RuleFunction


def rule(
    name: str, level: str, description: str, *, applies: Optional[str] = None
) -> Callable[[RuleFunction], RuleCheck]:
    """Declare the decorated function as the check of a rule.

    Args:
        name: The rule name that prefixes its violations.
        level: The capability level it needs (one of :data:`LEVELS`).
        description: What it checks, in one sentence (:attr:`ConformanceRule.description`).
        applies: Which stores of that level it runs for, when not all of them.
            An example is ``"only for a store with release_many"``.
            The function itself returns early for a store without the capability.

    Returns:
        A decorator that turns the function into a :class:`RuleCheck`.
        The function's docstring is the rule's detailed description.
    """
    if level not in LEVELS:
        raise ValueError(f"rule {name!r}: level {level!r} is not one of {', '.join(LEVELS)}")

    def declare(function: RuleFunction) -> RuleCheck:
        # Under python -OO there are no docstrings, so the description stands in for the details.
        details = inspect.cleandoc(function.__doc__) if function.__doc__ else description
        return RuleCheck(
            ConformanceRule(name, level, description), applies or _EVERY[level], details, function
        )

    return declare
