"""One small helper through which every setting reads the environment.

Every name read through it is remembered (:data:`READ`), so that :func:`refuse_unknown_names`
can tell a misspelled setting (``A2A_SSE_BUFER_BYTES``) from a real one and refuse to start
instead of silently running on the default.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from typing import TypeVar, overload

from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")

#: Every environment variable name a setting has read, in the order read.
READ: dict[str, None] = {}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@overload
def env_str(name: str, default: str) -> str: ...
@overload
def env_str(name: str, default: None = None) -> str | None: ...
def env_str(name: str, default: str | None = None) -> str | None:
    READ[name] = None
    value = os.environ.get(name)
    return default if value is None else value


def env_bool(name: str, default: bool = False) -> bool:
    READ[name] = None
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
    READ[name] = None
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        result = cast(value.strip())
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, not {value!r}") from exc
    if minimum is not None and result < minimum:  # type: ignore[operator]  # T is int or float
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value!r}")
    return result


def env_int(name: str, default: int, *, minimum: int | None = 0) -> int:
    return _env_number(name, default, int, minimum)


def env_float(name: str, default: float, *, minimum: float | None = 0) -> float:
    return _env_number(name, default, float, minimum)


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    READ[name] = None
    value = os.environ.get(name)
    if value is None:
        return list(default or [])
    return [item.strip() for item in value.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    READ[name] = None
    value = (os.environ.get(name) or default).strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return value


def refuse_unknown_names(prefixes: tuple[str, ...]) -> None:
    """Refuse to start when the environment holds a name with one of ``prefixes`` that no setting
    reads: a misspelling would otherwise leave the default in force without a word.

    Call it after every setting has been read. The message names each unknown variable and,
    where one is close, the setting it probably meant.
    """
    unknown = sorted(name for name in os.environ if name.startswith(prefixes) and name not in READ)
    if not unknown:
        return
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name, list(READ), n=1, cutoff=0.75)
        lines.append(f"{name} (did you mean {close[0]}?)" if close else name)
    raise ImproperlyConfigured(
        "unknown setting" + ("s" if len(lines) > 1 else "") + " in the environment: "
        + "; ".join(lines)
        + ". Every setting is listed in docs/configuration.md; unset or rename the variable."
    )
