"""One small helper through which every setting reads the environment."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return default if value is None else value


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, not {value!r}")


def _env_number(name: str, default: T, cast: Callable[[str], T], minimum: float | None) -> T:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        result = cast(value.strip())
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, not {value!r}") from exc
    if minimum is not None and result < minimum:  # type: ignore[operator]
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value!r}")
    return result


def env_int(name: str, default: int, *, minimum: int | None = 0) -> int:
    return _env_number(name, default, int, minimum)


def env_float(name: str, default: float, *, minimum: float | None = 0) -> float:
    return _env_number(name, default, float, minimum)


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return list(default or [])
    return [item.strip() for item in value.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = (os.environ.get(name) or default).strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return value
