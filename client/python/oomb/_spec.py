"""Job specs from dicts, YAML text, YAML files or JobSpec messages.

The document is the one `oomb submit` reads: the YAML keys are the proto field names of
proto/oomb/v1/job_spec.proto, enum values are their words ("float32", "cosine"). It goes through
protobuf's json_format.ParseDict, after two steps that read the fields' `(oomb.v1.rules)` options
(rules.proto), as the CLI's codec does, so that nothing here names a field of the spec:

  - a number field's `zero_word` ("auto" for memory.chunk_tokens) stands for 0;
  - in a YAML file, a relative path in a field marked `path` (model.path, data.train,
    data.validation, checkpoint.dir, method.lora.init_adapter, evaluation.haystack, ...) is made
    absolute against the file's directory. Dicts and YAML text are sent as they are.

A null value leaves the field unset. Unknown keys, two members of one oneof and values of the
wrong type raise `InvalidArgument` naming the field ("spec.data.trian"); defaults and ranges are
the server's to apply and check (CreateJob / EstimateJob / validate_only).
"""
from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Union

import grpc
import yaml
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor

from oomb._errors import InvalidArgument
from oomb._names import is_resource_name
from oomb.v1 import job_spec_pb2, rules_pb2

__all__ = ["SpecLike", "load_spec"]

SpecLike = Union[Mapping[str, Any], str, "os.PathLike[str]", job_spec_pb2.JobSpec]
_YAML_SUFFIXES = (".yaml", ".yml", ".json")
_FD = FieldDescriptor


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (as the CLI does)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, (str, int, float, bool)) and key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _error(path: str, what: str) -> InvalidArgument:
    field = f"spec.{path}" if path else "spec"
    return InvalidArgument(f"spec: {path + ': ' if path else ''}{what}", code=grpc.StatusCode.INVALID_ARGUMENT,
                           field=field)


def _rules(field: FieldDescriptor) -> Optional[rules_pb2.FieldRules]:
    options = field.GetOptions()
    return options.Extensions[rules_pb2.rules] if options.HasExtension(rules_pb2.rules) else None


def _is_map(field: Any) -> bool:  # (descriptors: Any, as typeshed makes message_type Optional)
    return (field.type == _FD.TYPE_MESSAGE and field.message_type.GetOptions().map_entry)


def _is_repeated(field: Any) -> bool:
    # FieldDescriptor.label is deprecated in newer protobuf releases; is_repeated replaces it.
    rep = getattr(field, "is_repeated", None)
    return bool(rep) if rep is not None else field.label == _FD.LABEL_REPEATED


def _scalar(field: FieldDescriptor, value: Any, path: str, base_dir: Optional[str]) -> Any:
    rules = _rules(field)
    if isinstance(value, (dict, list)):
        raise _error(path, f"expected a single value, got a {'mapping' if isinstance(value, dict) else 'list'}")
    if rules is not None and rules.zero_word and isinstance(value, str) and value == rules.zero_word:
        return 0
    if field.type == _FD.TYPE_STRING:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # labels: {version: 2}
        if rules is not None and rules.path and isinstance(value, os.PathLike):
            value = os.fspath(value)
        if rules is not None and rules.path and base_dir and isinstance(value, str) and value \
                and not os.path.isabs(value) and not is_resource_name(rules.resource, value):
            value = os.path.normpath(os.path.join(base_dir, value))
    return value


def _check_leaf(descriptor: Any, key: str, value: Any, path: str) -> None:
    """ParseDict on one field alone, so that a bad value is reported under its own path."""
    try:
        json_format.ParseDict({key: value}, message_factory.GetMessageClass(descriptor)())
    except json_format.ParseError as e:
        raise _error(path, str(e).split(" at ")[0]) from None


def _normalize(descriptor: Any, data: Any, prefix: str, base_dir: Optional[str]) -> Dict[str, Any]:
    if not isinstance(data, Mapping):
        raise _error(prefix, f"expected a mapping, got {type(data).__name__}")
    out: Dict[str, Any] = {}
    oneofs: Dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise _error(prefix, f"keys must be strings, got {key!r}")
        path = f"{prefix}.{key}" if prefix else key
        field = descriptor.fields_by_name.get(key)
        if field is None:
            known = ", ".join(f.name for f in descriptor.fields)
            raise _error(path, f"unknown field (known: {known})")
        if value is None:
            continue  # unset: the default applies
        if field.containing_oneof is not None:
            other = oneofs.setdefault(field.containing_oneof.name, key)
            if other != key:
                raise _error(path, f"{other} is set too: at most one of them")
        if _is_map(field):
            if not isinstance(value, Mapping):
                raise _error(path, f"expected a mapping, got {type(value).__name__}")
            value_field = field.message_type.fields_by_name["value"]
            if value_field.type == _FD.TYPE_MESSAGE:
                out[key] = {str(k): _normalize(value_field.message_type, v, f"{path}.{k}", base_dir)
                            for k, v in value.items()}
            else:
                out[key] = {str(k): _scalar(value_field, v, f"{path}.{k}", base_dir) for k, v in value.items()}
        elif field.type == _FD.TYPE_MESSAGE:
            if _is_repeated(field):
                if not isinstance(value, list):
                    raise _error(path, f"expected a list, got {type(value).__name__}")
                out[key] = [_normalize(field.message_type, v, f"{path}[{i}]", base_dir) for i, v in enumerate(value)]
            else:
                out[key] = _normalize(field.message_type, value, path, base_dir)
        elif _is_repeated(field):
            if not isinstance(value, list):
                raise _error(path, f"expected a list, got {type(value).__name__}")
            out[key] = [_scalar(field, v, f"{path}[{i}]", base_dir) for i, v in enumerate(value)]
        else:
            out[key] = _scalar(field, value, path, base_dir)
        if field.type != _FD.TYPE_MESSAGE or _is_map(field):
            _check_leaf(descriptor, key, out[key], path)
    return out


def _parse(document: Any, base_dir: Optional[str]) -> job_spec_pb2.JobSpec:
    if document is None:
        document = {}
    normalized = _normalize(job_spec_pb2.JobSpec.DESCRIPTOR, document, "", base_dir)
    spec = job_spec_pb2.JobSpec()
    try:
        json_format.ParseDict(normalized, spec)
    except json_format.ParseError as e:  # pragma: no cover - _normalize checks each field first
        raise _error("", str(e)) from None
    return spec


def _load_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise InvalidArgument(f"{source}: {e}", code=grpc.StatusCode.INVALID_ARGUMENT) from None


def _looks_like_path(text: str) -> bool:
    if "\n" in text:
        return False
    return os.path.isfile(text) or (text.endswith(_YAML_SUFFIXES) and ": " not in text)


def load_spec(spec: SpecLike) -> job_spec_pb2.JobSpec:
    """A JobSpec message from any of the forms `jobs.create` accepts.

    Args:
      spec: a dict (the YAML document's structure), YAML text, a `pathlib.Path` or a path
        string naming a YAML file (relative path fields resolved against the file's directory),
        or a `JobSpec` message (copied).

    Raises:
      InvalidArgument: an unknown key, a value of the wrong type, bad YAML (naming the field).
      FileNotFoundError: a path that does not exist.
    """
    if isinstance(spec, job_spec_pb2.JobSpec):
        out = job_spec_pb2.JobSpec()
        out.CopyFrom(spec)
        return out
    if isinstance(spec, Mapping):
        return _parse(spec, None)
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and _looks_like_path(spec)):
        path = os.fspath(spec)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        return _parse(_load_yaml(text, path), os.path.dirname(os.path.abspath(path)))
    if isinstance(spec, str):
        return _parse(_load_yaml(spec, "spec"), None)
    raise TypeError(f"a job spec is a dict, YAML text, a path or a JobSpec, not {type(spec).__name__}")
