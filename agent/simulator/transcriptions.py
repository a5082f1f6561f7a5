"""``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``: a multipart upload,
read as it arrives.

The simulator does not hear audio: the "transcription" says how many bytes the file had and
the start of their SHA-256, so a test can tell that every byte arrived in order. The body
is never held whole: each piece is fed to the multipart reader (``wire.multipart``), the
file's bytes are hashed and counted and let go. ``UploadStats`` counts the file bytes
received across requests, as they arrive (``GET /sim/uploads``), so a test can see an
upload reach the engine while its client is still sending it.
"""

from __future__ import annotations

import hashlib

import msgspec

from agent.simulator.errors import ApiError, invalid_request, model_not_found
from wire.multipart import (
    BodyEnded,
    MalformedMultipart,
    MultipartReader,
    PartData,
    PartEnded,
    PartStarted,
    boundary_of,
)

MAX_UPLOAD_BYTES = 1 << 30
MAX_FIELD_BYTES = 4096
FORMATS = ("json", "text", "verbose_json")


class UploadStats(msgspec.Struct):
    """File bytes received so far by every upload, and uploads being read now."""

    bytes_received: int = 0
    in_progress: int = 0


class Transcription(msgspec.Struct, frozen=True):
    """What the form said and what its file held."""

    model: str
    file_bytes: int
    sha256: str
    response_format: str
    task: str = "transcribe"
    """``transcribe`` or ``translate`` (``/v1/audio/translations``): the simulator does the
    same for both, and names the task in a ``verbose_json`` answer."""

    def text(self) -> str:
        return f"{self.file_bytes} bytes, sha256 {self.sha256[:16]}"

    def body(self) -> tuple[bytes, bytes]:
        """The content type and body of the answer, in the requested format."""
        if self.response_format == "text":
            return b"text/plain; charset=utf-8", self.text().encode()
        payload: dict[str, object] = {"text": self.text()}
        if self.response_format == "verbose_json":
            payload |= {"task": self.task, "language": "en", "duration": 0.0, "segments": []}
        payload["usage"] = {"type": "duration", "seconds": 0}
        return b"application/json", msgspec.json.encode(payload)


class TranscriptionReader:
    """Feed it the body's pieces; ``result`` once the body is complete."""

    def __init__(self, content_type: str, stats: UploadStats) -> None:
        try:
            self._reader = MultipartReader(boundary_of(content_type))
        except MalformedMultipart as exc:
            raise invalid_request(f"Invalid upload: {exc}.") from exc
        self._stats = stats
        self._fields: dict[str, str] = {}
        self._field: str | None = None
        self._value = bytearray()
        self._in_file = False
        self._files = 0
        self._hash = hashlib.sha256()
        self._size = 0
        self._total = 0

    def feed(self, chunk: bytes) -> None:
        self._total += len(chunk)
        if self._total > MAX_UPLOAD_BYTES:
            raise ApiError(413, f"The upload exceeds {MAX_UPLOAD_BYTES} bytes.")
        try:
            events = self._reader.feed(chunk)
        except MalformedMultipart as exc:
            raise invalid_request(f"Invalid upload: {exc}.") from exc
        for event in events:
            if isinstance(event, PartStarted):
                self._in_file = event.filename is not None and event.name == "file"
                self._files += self._in_file
                self._field = None if event.filename is not None else event.name
                self._value.clear()
            elif isinstance(event, PartData):
                if self._in_file:
                    self._hash.update(event.data)
                    self._size += len(event.data)
                    self._stats.bytes_received += len(event.data)
                elif self._field is not None:
                    self._value += event.data
                    if len(self._value) > MAX_FIELD_BYTES:
                        raise invalid_request(f"The field `{self._field}` is too long.")
            elif isinstance(event, PartEnded):
                if self._field is not None:
                    self._fields[self._field] = self._value.decode("utf-8", errors="replace")
                self._in_file = False
                self._field = None
            elif isinstance(event, BodyEnded):
                pass

    def result(self, served_model: str, task: str = "transcribe") -> Transcription:
        try:
            self._reader.finish()
        except MalformedMultipart as exc:
            raise invalid_request(f"Invalid upload: {exc}.") from exc
        model = self._fields.get("model", served_model)
        if model != served_model:
            raise model_not_found(model)
        if self._files != 1:
            raise invalid_request("The form must have one `file` part.", param="file")
        response_format = self._fields.get("response_format", "json")
        if response_format not in FORMATS:
            raise invalid_request(
                f"`response_format` must be one of {', '.join(FORMATS)}.",
                param="response_format",
            )
        return Transcription(model, self._size, self._hash.hexdigest(), response_format, task)
