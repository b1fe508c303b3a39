"""User code named in a job file: ``{factory: "package.module:function", kwargs: {...}}``.

A consortium agrees on its code (a model, a dataset, a training loop) and every organisation installs
its own copy; the job file names a function in it, and each party imports that function locally. Only
tensors travel between parties: no code, no pickle. Importing is running code, so a factory is
trusted exactly as much as the job file the party validated itself (docs/security.md).

:class:`FactoryRef` is the job-file model; :meth:`FactoryRef.call` imports and calls the function and
raises :class:`FactoryError` (a ValueError) naming the job-file field, whether the module is missing, the
name is not in it, it is not callable, or the call raised.
"""
from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator

_REF = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class FactoryError(ValueError):
    """User code named in the job could not be imported or called; ``field`` is the job-file field
    (``params.model.factory``), ``party`` the party where it happened (set by the caller, may be None)."""

    def __init__(self, field: str, message: str, party: str | None = None):
        self.field, self.party, self.message = field, party, message
        super().__init__(f"{field}: {message}" if party is None else f"{party}: {field}: {message}")

    def at(self, party: str) -> "FactoryError":
        """The same error, naming ``party``."""
        return FactoryError(self.field, self.message, party)


class FactoryRef(BaseModel):
    """A function of the consortium's code, and the keyword arguments to call it with.

    Attributes:
        factory: ``"package.module:function"`` (a dotted attribute path after the colon is allowed,
            e.g. ``"mypkg.models:Nets.resnet8"``), importable at the party.
        kwargs: keyword arguments of the call (JSON/YAML values).
        path: an extra folder to import from (relative to the job file), for code that is not installed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    factory: str = Field(description="'package.module:function' of the consortium's code, importable at the party")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the factory call")
    path: Path | None = Field(default=None, description="folder added to the import path (relative to the job file)")

    @field_validator("factory")
    @classmethod
    def _reference(cls, v: str) -> str:
        if not _REF.match(v):
            raise ValueError(f"{v!r} is not 'package.module:function'")
        return v

    def resolve(self, field: str, base: Path | None = None, path_field: str | None = None) -> Callable:
        """The named callable; FactoryError naming ``field`` when it cannot be imported or is not callable.
        ``base``: the job file's folder, against which a relative :attr:`path` is taken; ``path_field``: the job-file
        field of the import folder that the error suggests (default: the reference's ``path``)."""
        module_name, attr = self.factory.split(":")
        if self.path is not None:
            folder = str(self.path if self.path.is_absolute() or base is None else (base / self.path).resolve())
            if folder not in sys.path:
                sys.path.insert(0, folder)
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as exc:
            folder = path_field or f"{field.removesuffix('.factory')}.path"  # the reference's own import folder
            raise FactoryError(field, f"cannot import {module_name!r} ({exc}): install the consortium's agreed code "
                                      f"at this party, or set {folder} to its folder") from None
        except Exception as exc:  # noqa: BLE001 - the module's own top-level code failed
            raise FactoryError(field, f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise FactoryError(field, f"{module_name!r} has no {attr!r}")
            obj = getattr(obj, part)
        if not callable(obj):
            raise FactoryError(field, f"{self.factory!r} is a {type(obj).__name__}, not a function or class")
        return obj

    def call(self, field: str, base: Path | None = None, path_field: str | None = None, **extra: Any) -> Any:
        """``factory(**kwargs, **extra)``; FactoryError naming ``field`` when it cannot be resolved (see
        :meth:`resolve`) or raises."""
        fn = self.resolve(field, base, path_field)
        try:
            return fn(**{**self.kwargs, **extra})
        except Exception as exc:  # noqa: BLE001 - any failure of user code becomes one clear error
            raise FactoryError(field, f"{self.factory}(**{sorted({**self.kwargs, **extra})}) raised "
                                      f"{type(exc).__name__}: {exc}") from exc
