"""The NVML recording format: what each NVML call answered, so a machine can be replayed.

A recording is JSON::

    {
      "format": "llmgw-nvml-recording/1",
      "meta": {"description": "...", "recorded_at": "...", "driver_version": "..."},
      "library": {"nvmlInit": [{"returns": null}], "nvmlDeviceGetCount": [{"returns": 8}]},
      "gpus": {
        "0": {
          "nvmlDeviceGetUUID": [{"returns": "GPU-..."}],
          "nvmlDeviceGetRetiredPagesPendingStatus": [
            {"raises": {"error": "NVMLError_NotSupported", "value": 3}}
          ]
        }
      }
    }

``library`` holds the calls that name no GPU; ``gpus`` the calls on one GPU's handle,
keyed by its index. Each function has its answers in the order they were given; a
replay hands them out in that order and repeats the last one once the list runs out, so
a recording of one snapshot answers any number of them. An answer either ``returns`` a
value or ``raises`` an error named by its pynvml class and NVML code (``value`` is null
for an error that did not come from NVML). Arguments other than the handle are not
recorded: the source always passes the same ones.

Values are JSON: handles ``{"handle": INDEX}``, memory ``{"total", "free", "used"}`` in
bytes, row remapping ``[corrected, uncorrected, pending, failure]``, an event
``{"device": {"handle": INDEX} | null, "eventType": 8, "eventData": XID}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

from agent.gpus.files import write_atomically
from app.regular_file import FileRefused, read_regular_text

FORMAT = "llmgw-nvml-recording/1"
MAX_RECORDING_BYTES = 16 * 2**20
"""The largest recording read: one of eight GPUs polled a while is some hundred KiB."""

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]
Answers = dict[str, list["Answer"]]


class RecordingError(ValueError):
    """A recording that does not follow the format."""


@dataclass(frozen=True, slots=True)
class RaisedError:
    error: str
    value: int | None
    message: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    returns: JsonValue = None
    raises: RaisedError | None = None


@dataclass(slots=True)
class Recording:
    library: Answers = field(default_factory=dict)
    gpus: dict[int, Answers] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)

    def answers(self, gpu: int | None) -> Answers:
        """The answers for one GPU, or the library's for None (created when missing)."""
        return self.library if gpu is None else self.gpus.setdefault(gpu, {})


# -- reading -----------------------------------------------------------------------------


def load_recording(path: Path) -> Recording:
    """The recording in ``path``: a regular file of UTF-8 JSON, at most
    ``MAX_RECORDING_BYTES``; anything else is a ``RecordingError`` naming it."""
    try:
        document = json.loads(read_regular_text(path, MAX_RECORDING_BYTES))
    except FileRefused as exc:
        raise RecordingError(str(exc)) from exc
    except json.JSONDecodeError as exc:
        raise RecordingError(f"{path} is not JSON: {exc}") from exc
    try:
        return parse_recording(document)
    except RecordingError as exc:
        raise RecordingError(f"{path}: {exc}") from exc


def parse_recording(document: JsonValue) -> Recording:
    top = _object(document, "the recording")
    if top.get("format") != FORMAT:
        raise RecordingError(f"format must be {FORMAT!r}, found {top.get('format')!r}")
    meta = _object(top.get("meta", {}), "meta")
    gpus = _object(top.get("gpus", {}), "gpus")
    return Recording(
        library=_answers(top.get("library", {}), "library"),
        gpus={_gpu_index(key): _answers(value, f"gpus.{key}") for key, value in gpus.items()},
        meta={key: str(value) for key, value in meta.items()},
    )


def _object(value: JsonValue, where: str) -> dict[str, JsonValue]:
    if not isinstance(value, dict):
        raise RecordingError(f"{where} must be an object")
    return value


def _gpu_index(key: str) -> int:
    if not (key.isascii() and key.isdigit()):  # not "²", which isdigit() takes
        raise RecordingError(f"gpus keys are GPU indices, found {key!r}")
    return int(key)


def _answers(value: JsonValue, where: str) -> Answers:
    functions = _object(value, where)
    parsed: Answers = {}
    for function, answers in functions.items():
        if not isinstance(answers, list) or not answers:
            raise RecordingError(f"{where}.{function} must be a non-empty list of answers")
        parsed[function] = [_answer(item, f"{where}.{function}") for item in answers]
    return parsed


def _answer(value: JsonValue, where: str) -> Answer:
    item = _object(value, f"each answer of {where}")
    if ("returns" in item) == ("raises" in item):
        raise RecordingError(f"each answer of {where} has either 'returns' or 'raises'")
    if "returns" in item:
        return Answer(returns=item["returns"])
    raised = _object(item["raises"], f"'raises' of {where}")
    error, code, message = raised.get("error"), raised.get("value"), raised.get("message", "")
    if not isinstance(error, str) or not _is_code(code):
        raise RecordingError(f"'raises' of {where} needs an error name and an integer value")
    return Answer(raises=RaisedError(error, code, str(message)))


def _is_code(value: JsonValue) -> TypeGuard[int | None]:
    """An NVML error code, or null; ``true`` is an int to Python but not a code."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


# -- writing -----------------------------------------------------------------------------


def dump_recording(recording: Recording) -> str:
    """The recording as JSON text, one line per function so recordings diff well."""
    lines = ["{", f'  "format": {json.dumps(FORMAT)},']
    meta = json.dumps(recording.meta, indent=2, sort_keys=True).replace("\n", "\n  ")
    lines.append(f'  "meta": {meta},')
    lines.append(f'  "library": {_dump_answers(recording.library, "  ")},')
    gpus = [
        f'    "{index}": {_dump_answers(recording.gpus[index], "    ")}'
        for index in sorted(recording.gpus)
    ]
    lines.append('  "gpus": {' + ("\n" + ",\n".join(gpus) + "\n  }" if gpus else "}"))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dump_answers(answers: Answers, indent: str) -> str:
    if not answers:
        return "{}"
    rows = [
        f"{indent}  {json.dumps(function)}: {json.dumps([_encode(a) for a in items])}"
        for function, items in answers.items()
    ]
    return "{\n" + ",\n".join(rows) + f"\n{indent}}}"


def _encode(answer: Answer) -> JsonValue:
    if answer.raises is None:
        return {"returns": answer.returns}
    raised: dict[str, JsonValue] = {"error": answer.raises.error, "value": answer.raises.value}
    if answer.raises.message:
        raised["message"] = answer.raises.message
    return {"raises": raised}


def write_recording(path: Path, recording: Recording) -> None:
    write_atomically(path, dump_recording(recording))
