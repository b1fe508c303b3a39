"""Old parameter spellings, accepted for one release, and per-algorithm defaults of a shared model.

An old name is rewritten to the new one before validation, with a :class:`DeprecationWarning` and a log
line (logger ``secureflhv.params``) that both name the new field; giving both spellings is an error.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Callable

from pydantic import BaseModel, create_model
from pydantic.fields import FieldInfo

from .._version import __version__

log = logging.getLogger("secureflhv.params")


def warn_renamed(old: str, new: str, note: str = "") -> None:
    """Warn (DeprecationWarning and a log line) that ``old`` is now spelled ``new``."""
    msg = (f"parameter {old!r} is deprecated since {__version__}: use {new!r}{note}; the old name is accepted "
           f"for one release")
    warnings.warn(msg, DeprecationWarning, stacklevel=4)
    log.warning("%s", msg)


def rename(data: Any, renames: dict[str, str]) -> Any:
    """``data`` (a dict of raw fields; anything else is returned as is) with each old name of ``renames``
    (old -> new) replaced by its new name.

    Raises:
        ValueError: both the old and the new name are given (``"<old>: ..."``, so the error names it).
    """
    if not isinstance(data, dict) or not renames.keys() & data.keys():
        return data
    out = dict(data)
    for old, new in renames.items():
        if old in out:
            if new in out:
                raise ValueError(f"{old}: renamed to {new}; give {new} only")
            warn_renamed(old, new)
            out[new] = out.pop(old)
    return out


def deprecated_names(renames: dict[str, str]) -> Callable[[Any], Any]:
    """A ``model_validator(mode="before")`` body that accepts the old names of ``renames`` (see :func:`rename`)."""
    def accept(data: Any) -> Any:
        return rename(data, renames)
    return accept


def with_defaults(model: type[BaseModel], **defaults: Any) -> type[BaseModel]:
    """A subclass of ``model`` whose fields named in ``defaults`` default to the given values; their type,
    bounds and description stay those of ``model`` (one definition, per-algorithm defaults).

    Raises:
        KeyError: a name that is not a field of ``model``.
    """
    fields = {name: (model.model_fields[name].annotation,
                     FieldInfo.merge_field_infos(model.model_fields[name], default=value))
              for name, value in defaults.items()}
    return create_model(model.__name__, __base__=model, __module__=model.__module__, **fields)
