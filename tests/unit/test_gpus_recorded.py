"""RecordedNvml replays a recording the way pynvml would answer."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from agent.gpus.recorded import RecordedHandle, RecordedNvml, RecordingMismatch
from agent.gpus.recording import (
    Answer,
    RaisedError,
    Recording,
    RecordingError,
    dump_recording,
    load_recording,
    parse_recording,
)

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"


def lost() -> Answer:
    return Answer(raises=RaisedError("NVMLError_GpuIsLost", 15))


def test_errors_are_raised_as_pynvml_error_classes() -> None:
    nvml = RecordedNvml(Recording(gpus={0: {"nvmlDeviceGetUUID": [lost()]}}))

    with pytest.raises(pynvml.NVMLError_GpuIsLost) as raised:
        nvml.nvmlDeviceGetUUID(RecordedHandle(0))

    assert raised.value.value == pynvml.NVML_ERROR_GPU_IS_LOST
    assert str(raised.value) == "GPU is lost"


def test_answers_come_in_order_and_the_last_one_repeats() -> None:
    answers = [Answer(returns=2), Answer(returns=1)]
    nvml = RecordedNvml(Recording(library={"nvmlDeviceGetCount": answers}))

    counts = [nvml.nvmlDeviceGetCount() for _ in range(4)]

    assert counts == [2, 1, 1, 1]


def test_each_gpu_has_its_own_answers() -> None:
    recording = Recording(
        gpus={
            0: {"nvmlDeviceGetName": [Answer(returns="NVIDIA A100-SXM4-80GB")]},
            1: {"nvmlDeviceGetName": [Answer(returns="NVIDIA H100 80GB HBM3")]},
        }
    )
    nvml = RecordedNvml(recording)

    names = [nvml.nvmlDeviceGetName(RecordedHandle(index)) for index in (1, 0)]

    assert names == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]


def test_a_call_the_recording_does_not_answer_is_a_mismatch() -> None:
    nvml = RecordedNvml(Recording(gpus={0: {}}))

    with pytest.raises(RecordingMismatch, match="nvmlDeviceGetMemoryInfo on GPU 0"):
        nvml.nvmlDeviceGetMemoryInfo(RecordedHandle(0))


def test_a_handle_that_did_not_come_from_the_recording_is_an_invalid_argument() -> None:
    nvml = RecordedNvml(Recording())

    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetUUID(object())


def test_an_error_name_that_does_not_match_its_code_is_a_mismatch() -> None:
    misnamed = Answer(raises=RaisedError("NVMLError_GPUIsLost", 15))
    nvml = RecordedNvml(Recording(library={"nvmlInit": [misnamed]}))

    with pytest.raises(RecordingMismatch, match="NVMLError_GpuIsLost"):
        nvml.nvmlInit()


def test_every_fixture_survives_dump_and_parse() -> None:
    for path in sorted(FIXTURES.glob("*.json")):
        recording = load_recording(path)

        again = parse_recording(json.loads(dump_recording(recording)))

        assert again == recording, path.name
        assert path.read_text(encoding="utf-8") == dump_recording(recording), path.name


@pytest.mark.parametrize(
    ("document", "complaint"),
    [
        ({"format": "something else"}, "format must be"),
        ({"format": "llmgw-nvml-recording/1", "gpus": {"zero": {}}}, "GPU indices"),
        ({"format": "llmgw-nvml-recording/1", "gpus": {"\u00b2": {}}}, "GPU indices"),
        ({"format": "llmgw-nvml-recording/1", "gpus": {"\u0663": {}}}, "GPU indices"),
        (
            {
                "format": "llmgw-nvml-recording/1",
                "library": {
                    "nvmlInit": [{"raises": {"error": "NVMLError_Unknown", "value": True}}]
                },
            },
            "integer value",
        ),
        ({"format": "llmgw-nvml-recording/1", "library": {"nvmlInit": []}}, "non-empty list"),
        (
            {"format": "llmgw-nvml-recording/1", "library": {"nvmlInit": [{}]}},
            "either 'returns' or 'raises'",
        ),
        (
            {
                "format": "llmgw-nvml-recording/1",
                "library": {
                    "nvmlInit": [{"raises": {"error": "NVMLError_Unknown", "value": "999"}}]
                },
            },
            "integer value",
        ),
    ],
)
def test_malformed_recordings_are_refused_with_the_reason(
    document: dict[str, object], complaint: str
) -> None:
    with pytest.raises(RecordingError, match=complaint):
        parse_recording(document)  # type: ignore[arg-type]


def test_a_file_that_is_not_json_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{", encoding="utf-8")

    with pytest.raises(RecordingError, match=r"broken\.json is not JSON"):
        load_recording(path)
