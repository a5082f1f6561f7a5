"""Two operators changing a model's autoscaling policy at once, each one field: both changes
are kept, because ``llmgw-cli autoscale`` sends only its fields (``PATCH .../autoscale``) and
the admin API merges them with the policy the change is recorded on, instead of the client
writing back a whole policy it read before the other's change. Served in this event loop over
a real PostgreSQL store; the rest of the policy's API is in test_autoscale_api.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from app.domain.events import ModelDeclared, model_stream
from app.store.postgres import PostgresEventStore
from tests.integration.test_autoscale_api import DEFAULTS, a_model, declare
from tests.support.admin_server import bearer_client
from tests.support.operator_cli import TOKEN, Operator, live_admin_api

pytestmark = pytest.mark.timeout(120)


def answered_after(
    model: str, meanwhile: Callable[[], Awaitable[None]]
) -> Callable[[ASGIApp], ASGIApp]:
    """In front of the admin API: the first request about ``model`` is handled, and its
    answer held until ``meanwhile`` has run. An operator's read (or change) is answered as
    it was before another operator's change, and the first one goes on only after it."""
    prefix = f"/admin/v1/models/{model}"
    hooked: list[str] = []

    def wrap(app: ASGIApp) -> ASGIApp:
        async def held_answer(scope: Scope, receive: Receive, send: Send) -> None:
            if hooked or scope["type"] != "http" or not scope["path"].startswith(prefix):
                await app(scope, receive, send)
                return
            hooked.append(scope["method"])
            answer: list[Message] = []

            async def hold(message: Message) -> None:
                answer.append(message)

            await app(scope, receive, hold)
            await meanwhile()
            for message in answer:
                await send(message)

        return held_answer

    return wrap


@pytest_asyncio.fixture(loop_scope="session")
async def admin(pg_store: PostgresEventStore) -> AsyncIterator[httpx.AsyncClient]:
    async with live_admin_api(pg_store) as url, bearer_client(url, TOKEN) as client:
        yield client


async def test_two_operators_changing_different_fields_at_once_both_keep_their_change(
    admin: httpx.AsyncClient, pg_store: PostgresEventStore, tmp_path: Path
) -> None:
    model = a_model()
    await declare(admin, model)
    on = await admin.put(f"/admin/v1/models/{model}/autoscale", json={"max": 4})
    assert on.status_code == 200, on.text
    told: list[str] = []

    async def bob_raises_the_floor() -> None:
        bob = Operator(home=tmp_path / "bob", admin_url=url)
        bob.home.mkdir()
        raised = await bob.run("autoscale", model, "--min", "2")
        told.append(raised.stderr if raised.code else raised.stdout)

    async with live_admin_api(pg_store, wrap=answered_after(model, bob_raises_the_floor)) as url:
        alice = Operator(home=tmp_path, admin_url=url)
        widened = await alice.run("autoscale", model, "--max", "8")
        shown = (await alice.run("model", model, "--output", "json")).json()

    assert widened.code == 0, widened.stderr
    assert [line.startswith(f"model {model}: autoscaled, 2..") for line in told] == [True], told
    assert shown["spec"]["autoscale"] == DEFAULTS | {"min": 2, "max": 8}
    last = (await pg_store.read_stream(model_stream(model)))[-1].event
    assert isinstance(last, ModelDeclared)
    assert (last.spec.autoscale and last.spec.autoscale.min_replicas) == 2


# -- PATCH /admin/v1/models/{name}/autoscale -----------------------------------------------


async def test_a_patch_changes_only_its_fields_and_null_puts_one_back_to_its_default(
    admin: httpx.AsyncClient,
) -> None:
    model = a_model()
    await declare(admin, model)
    path = f"/admin/v1/models/{model}/autoscale"

    on = await admin.patch(path, json={"max": 8, "capacity": 0.8})
    more = await admin.patch(path, json={"min": 0, "target": 6})
    same = await admin.patch(path, json={"max": 8})
    back = await admin.patch(path, json={"capacity": None, "min": None})

    assert [a.status_code for a in (on, more, same, back)] == [200] * 4, back.text
    assert [a.json()["changed"] for a in (on, more, same, back)] == [True, True, False, True]
    assert on.json()["model"]["spec"]["autoscale"] == DEFAULTS | {"max": 8, "capacity": 0.8}
    assert more.json()["model"]["spec"]["autoscale"] == DEFAULTS | {
        "min": 0,
        "max": 8,
        "target": 6.0,
        "capacity": 0.8,
    }
    assert back.json()["model"]["spec"]["autoscale"] == DEFAULTS | {"max": 8, "target": 6.0}


@pytest.mark.parametrize(
    ("patch", "status", "words"),
    [
        ({"min": 9}, 422, "9 is above the model's max (4), which this change keeps"),
        ({"min": 9, "max": 2}, 422, "must be at least min (9)"),
        ({"max": 0}, 422, "must be between 1 and 10000"),
        ({"target": "6"}, 400, "Expected `float | null`, got `str`"),
        ({"mni": 2}, 400, "Object contains unknown field `mni`"),
        ([{"max": 2}], 400, "Expected `object`, got `array`"),
    ],
)
async def test_a_hostile_patch_is_refused_saying_why_and_records_nothing(
    admin: httpx.AsyncClient,
    pg_store: PostgresEventStore,
    patch: object,
    status: int,
    words: str,
) -> None:
    model = a_model()
    await declare(admin, model)
    assert (await admin.put(f"/admin/v1/models/{model}/autoscale", json={"max": 4})).is_success
    before = await pg_store.last_position()

    answer = await admin.patch(f"/admin/v1/models/{model}/autoscale", json=patch)

    assert answer.status_code == status, answer.text
    assert words in answer.text
    assert await pg_store.last_position() == before


async def test_a_patch_of_an_unknown_model_is_a_404(admin: httpx.AsyncClient) -> None:
    answer = await admin.patch(f"/admin/v1/models/{a_model()}/autoscale", json={"max": 2})

    assert answer.status_code == 404, answer.text
