"""Every public name of the API has a docstring (the docs site's API
reference is generated from them), and so does every public method and
property of its classes."""

from __future__ import annotations

import importlib
import inspect

import pytest

PUBLIC = {
    "dafka": None,  # None: the module's __all__
    "dafka.aio": None,
    "dafka.metrics": ["register", "serve", "PeerCollector"],
    "dafka.store": None,
    "dafka.towerd.tower": ["Tower"],
    "dafka.mirror": None,
    "dafka.cdc.apply": None,
    "dafka.config": ["Config", "ConfigError", "Key"],
}


def public_objects():
    for module_name, names in PUBLIC.items():
        module = importlib.import_module(module_name)
        for name in names if names is not None else getattr(module, "__all__", []):
            yield f"{module_name}.{name}", getattr(module, name)


def undocumented(qualname: str, obj: object) -> list[str]:
    missing = [] if inspect.getdoc(obj) else [qualname]
    if inspect.isclass(obj) and not issubclass(obj, BaseException):
        for attr, member in vars(obj).items():
            if attr.startswith("_"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isfunction(member) or isinstance(member, property):
                if not (member.__doc__ or "").strip():
                    missing.append(f"{qualname}.{attr}")
    return missing


@pytest.mark.parametrize("qualname, obj", list(public_objects()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_public_name_has_a_docstring(qualname, obj):
    assert undocumented(qualname, obj) == []
