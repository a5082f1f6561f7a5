"""The figures ``benchmarks/gateway.py`` derives from its rounds (added latency, CPU per
1,000 requests, ratios to direct and to each peer), the CPU it counts for a process tree,
and how ``benchmarks/profile_summary.py`` groups a py-spy profile."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from benchmarks.gateway import DIRECT, LLMGW, Round, Side, figures
from benchmarks.profile_summary import group_of, read, summarize
from benchmarks.routers import command, tree_cpu_s


def _side(requests: int, p50_ms: float, p99_ms: float, cpu_s: dict[str, float]) -> Side:
    return Side(
        requests=requests,
        errors=0,
        error_kinds={},
        seconds=1.0,
        rps=float(requests),
        p50_ms=p50_ms,
        p99_ms=p99_ms,
        first_byte_p50_ms=None,
        first_byte_p99_ms=None,
        gateway_header_p50_ms=None,
        gateway_header_p99_ms=None,
        cpu_s={"client": 0.1, "simulator": 0.2, **cpu_s},
    )


def _round(direct_p50: float, ours: tuple[int, float, float], peer: tuple[int, float]) -> Round:
    """``ours``: llmgw's requests, p50 and CPU seconds; ``peer``: vllm-router's requests
    and CPU seconds (its p50 is 1 ms)."""
    return Round(
        order=[DIRECT, LLMGW, "vllm-router"],
        sides={
            DIRECT: _side(4000, direct_p50, 2.0, {LLMGW: 0.0, "vllm-router": 0.0}),
            LLMGW: _side(ours[0], ours[1], 5.0, {LLMGW: ours[2], "vllm-router": 0.0}),
            "vllm-router": _side(peer[0], 1.0, 3.0, {LLMGW: 0.0, "vllm-router": peer[1]}),
        },
    )


def test_added_latency_cpu_and_ratios_are_per_round_then_the_median() -> None:
    rounds = [
        _round(0.5, (2000, 1.5, 0.4), (3000, 0.3)),
        _round(0.4, (1000, 1.6, 0.3), (2000, 0.2)),
        _round(0.6, (3000, 1.4, 0.3), (3000, 0.3)),
    ]

    ours = figures(LLMGW, rounds, "simulator")

    assert ours.added_p50_ms == pytest.approx(1.0)  # 1.0, 1.2, 0.8
    assert ours.added_p99_ms == pytest.approx(3.0)
    assert ours.rps == 2000
    assert ours.rps_ratio == pytest.approx(0.5)  # 0.5, 0.25, 0.75
    # 0.2, 0.3 and 0.1 ms of CPU per request: 200, 300 and 100 ms per 1,000.
    assert ours.cpu_ms_per_1000 == pytest.approx(200)
    assert ours.rps_vs == {"vllm-router": pytest.approx(2 / 3)}  # 2/3, 1/2, 1
    # Per request, ours over the router's: 0.2/0.1, 0.3/0.1, 0.1/0.1.
    assert ours.cpu_vs == {"vllm-router": pytest.approx(2.0)}
    assert ours.client_cpu_ms_per_1000 == pytest.approx(0.1 * 1e6 / 2000)


def test_direct_has_no_cpu_of_its_own_nor_cpu_ratios() -> None:
    rounds = [_round(0.5, (2000, 1.5, 0.4), (3000, 0.3))]

    direct = figures(DIRECT, rounds, "simulator")

    assert direct.cpu_ms_per_1000 is None
    assert direct.cpu_vs == {}
    assert direct.added_p50_ms == 0
    assert direct.rps_vs == {LLMGW: 2.0, "vllm-router": pytest.approx(4000 / 3000)}


def test_a_process_tree_cpu_is_at_least_the_process_own() -> None:
    own = resource.getrusage(resource.RUSAGE_SELF)
    ticks = 1 / os.sysconf("SC_CLK_TCK")

    assert tree_cpu_s(os.getpid()) >= own.ru_utime + own.ru_stime - 2 * ticks


def test_a_process_that_is_gone_costs_nothing() -> None:
    assert tree_cpu_s(2**22 + 12345) == 0.0


def test_the_routers_get_one_worker_and_round_robin() -> None:
    argv = command("vllm-router", Path("/venv"), "http://127.0.0.1:9000", 9001, 9002)

    assert argv[0] == "/venv/bin/vllm-router"
    assert argv[argv.index("--worker-urls") + 1] == "http://127.0.0.1:9000"
    assert argv[argv.index("--policy") + 1] == "round_robin"
    with pytest.raises(ValueError, match="unknown router"):
        command("litellm", Path("/venv"), "http://127.0.0.1:9000", 9001, 9002)


def test_a_profile_is_grouped_by_its_innermost_frame_and_by_the_whole_stack(
    tmp_path: Path,
) -> None:
    base = "<module> (benchmarks/gateway.py:1);run (uvloop/__init__.py:82)"
    send = "send (uvicorn/protocols/http/httptools_impl.py:500)"
    app = "_serve (app/gateway/completions.py:300)"
    profile = tmp_path / "p.collapsed"
    profile.write_text(
        f"{base};{app};{send} 6\n"
        f"{base};{app};observe (prometheus_client/metrics.py:9) 2\n"
        f"{base};{app};write (libc.so.6) 2\n"
    )

    text = summarize(read(profile), top=3)

    assert group_of(send) == "HTTP server (parsing, protocol, ASGI cycle)"
    assert group_of("send (app/listeners/exchange.py:200)") == group_of(send)
    assert group_of("write (libc.so.6)") == "system calls"
    assert "| HTTP server (parsing, protocol, ASGI cycle) |  60.0 % |  60.0 % |" in text
    assert "| metrics |  20.0 % |  20.0 % |" in text
    assert "| system calls |  20.0 % |  20.0 % |" in text
    # The app's frame is under every sample but is the leaf of none.
    assert "| the app's request handling |   0.0 % | 100.0 % |" in text
