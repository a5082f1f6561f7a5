"""One command per shard at a time, and no lock kept for a shard no command acts on."""

from __future__ import annotations

import asyncio

from wire.turns import Turns


async def test_a_second_command_of_a_shard_waits_for_the_first_and_others_do_not() -> None:
    turns: Turns[str] = Turns()
    order: list[str] = []
    stopping = asyncio.Event()

    async def stop() -> None:
        async with turns.of("r-1"):
            order.append("stop begins")
            await stopping.wait()
            order.append("stop ends")

    async def start(key: str) -> None:
        async with turns.of(key):
            order.append(f"start {key}")

    stopping_task = asyncio.create_task(stop())
    await asyncio.sleep(0)
    waiting = asyncio.create_task(start("r-1"))
    await start("r-2")
    for _ in range(3):
        await asyncio.sleep(0)
    assert order == ["stop begins", "start r-2"]
    assert len(turns) == 1

    stopping.set()
    await asyncio.gather(stopping_task, waiting)
    assert order == ["stop begins", "start r-2", "stop ends", "start r-1"]


async def test_no_lock_is_kept_once_every_command_of_a_shard_is_done() -> None:
    turns: Turns[str] = Turns()

    async def command(key: str) -> None:
        async with turns.of(key):
            await asyncio.sleep(0)

    await asyncio.gather(*(command(f"replica-{n % 50}") for n in range(500)))
    assert len(turns) == 0


async def test_a_command_that_fails_gives_its_turn_back() -> None:
    turns: Turns[str] = Turns()

    async def failing() -> None:
        async with turns.of("r-1"):
            raise RuntimeError("the supervisor failed")

    results = await asyncio.gather(failing(), failing(), return_exceptions=True)
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    assert len(turns) == 0
