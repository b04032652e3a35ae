"""Strict reads of `quantization_config` fields: JSON types are checked, never coerced.

`bool("false")` is True and `int(None)` a TypeError: exporters write booleans as strings and leave
fields null, so each reader goes through these and a wrong value is a ValueError naming the field,
the value and what is accepted (load_layer adds the config.json path). `where` names the object
read, e.g. "GPTQ quantization_config".
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["config_bool", "config_int"]

_BOOL_STRINGS = {"true": True, "false": False}


def config_bool(qc: Mapping[str, object], field: str, default: bool, where: str) -> bool:
    """`qc[field]` as a bool: JSON true/false or the strings "true"/"false" (any case); `default` if absent."""
    value = qc.get(field, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOL_STRINGS:
        return _BOOL_STRINGS[value.strip().lower()]
    raise ValueError(f"{where}.{field}={value!r} is invalid: expected true or false "
                     '(or the strings "true"/"false")')


def config_int(qc: Mapping[str, object], field: str, where: str, accepted: str, default: object = None) -> int:
    """`qc[field]` as an int (JSON integers only, not bools, floats or strings); `default` if absent."""
    value = qc.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}.{field}={value!r} is invalid: expected {accepted}")
    return value
