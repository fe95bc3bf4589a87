"""A config file's mapping: flat TOML or YAML, read before any key is checked."""

from __future__ import annotations

import os
import tomllib


def read_config_file(path: str | os.PathLike) -> dict:
    """The mapping in a .toml, .yaml or .yml file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"config file {path!r} does not exist")
    if path.endswith(".toml"):
        with open(path, "rb") as fh:
            try:
                data = tomllib.load(fh)
            except tomllib.TOMLDecodeError as err:
                raise ValueError(f"{path}: invalid TOML: {err}") from None
    elif path.endswith((".yaml", ".yml")):
        import yaml

        with open(path) as fh:
            try:
                data = yaml.safe_load(fh) or {}
            except yaml.YAMLError as err:
                raise ValueError(f"{path}: invalid YAML: {err}") from None
    else:
        raise ValueError(f"config file {path!r} must end in .toml, .yaml or .yml")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config must be a mapping of keys to values")
    return data
