"""Whether a playbook condition's dotted path (`payload.xids.*.xid`) leads somewhere in an
event's payload type: a misspelt field would never hold, and its playbook never fire."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel


def resolves(annotation: Any, path: list[str]) -> bool:
    """Whether a dotted path (`*` for any element of a list) leads somewhere in a value of this
    type; a mapping, or a value of any type, holds whatever is asked of it."""
    if not path:
        return True
    head, rest = path[0], path[1:]
    for option in options(annotation):
        origin = get_origin(option)
        if option is Any or option is dict or origin is dict:
            return True
        if head == "*" and origin in (list, tuple, set, frozenset):
            if any(resolves(a, rest) for a in get_args(option) if a is not Ellipsis):
                return True
        elif isinstance(option, type) and issubclass(option, BaseModel):
            field = option.model_fields.get(head)
            if field is not None and resolves(field.annotation, rest):
                return True
    return False


def options(annotation: Any) -> list[Any]:
    """The types a value of `annotation` may have (Optional, unions and Annotated unwrapped)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return options(get_args(annotation)[0])
    if origin in (Union, UnionType):
        return [t for a in get_args(annotation) for t in options(a)]
    return [annotation]
