"""htmx asks for regions of a page, and the live view of a task polls for new rows."""

from __future__ import annotations

import pytest

from .support import (
    KEY,
    POLLER,
    STOP_POLLING,
    SignIn,
    World,
    add_events,
    body,
    finish,
    poller,
    region,
    running,
    trace_rows,
)

pytestmark = pytest.mark.django_db


def test_an_htmx_filter_of_the_task_list_gets_only_the_results(
    signed_in: SignIn, world: World
) -> None:
    response = region(signed_in("viewer"), "/tasks/?state=QUEUED", "results")

    html = body(response).strip()
    assert response.status_code == 200
    assert html.startswith('<section id="results"')
    assert "<html" not in html
    assert 'class="filters' not in html
    assert f'href="/tasks/{world.queued.id}/"' in html
    assert f'href="/tasks/{world.stopped.id}/"' not in html


def test_the_same_task_list_url_without_htmx_is_the_whole_page(
    signed_in: SignIn, world: World
) -> None:
    html = body(signed_in("viewer").get("/tasks/?state=QUEUED"))

    assert "<html" in html
    assert 'id="results"' in html


def test_an_htmx_filter_of_the_audit_log_gets_only_the_results(
    signed_in: SignIn, history: World
) -> None:
    response = region(signed_in("viewer"), "/audit/?action=stop", "results")

    html = body(response).strip()
    assert html.startswith('<section id="results"')
    assert "<html" not in html
    assert "1 entry" in html


def test_an_htmx_poll_of_the_dashboard_gets_only_the_board(signed_in: SignIn, world: World) -> None:
    response = region(signed_in("viewer"), "/", "board")

    html = body(response).strip()
    assert html.startswith('<div id="board"')
    assert "<html" not in html
    assert "<h1>Dashboard</h1>" not in html
    assert KEY in html  # the uncertain write is on the board


def test_an_htmx_request_for_a_region_a_page_does_not_have_gets_the_whole_page(
    signed_in: SignIn, world: World
) -> None:
    response = region(signed_in("viewer"), "/", "main")

    assert "<html" in body(response)


def test_a_running_task_page_polls_for_rows_after_its_last_one(
    signed_in: SignIn, world: World
) -> None:
    task = running(world.queued)
    add_events(task, 3)

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/"))

    assert trace_rows(html) == [1, 2, 3]
    assert poller(task.id, 3) in html


def test_the_live_view_returns_only_the_rows_after_the_last_one_seen_and_keeps_polling(
    signed_in: SignIn, world: World
) -> None:
    task = running(world.queued)
    add_events(task, 5)

    response = signed_in("viewer").get(f"/tasks/{task.id}/live?after=3")

    assert response.status_code == 200
    html = body(response)
    assert "<html" not in html
    assert trace_rows(html) == [4, 5]
    assert poller(task.id, 5) in html


def test_the_live_view_with_nothing_new_returns_no_rows_and_keeps_polling(
    signed_in: SignIn, world: World
) -> None:
    task = running(world.queued)
    add_events(task, 2)

    html = body(signed_in("viewer").get(f"/tasks/{task.id}/live?after=2"))

    assert trace_rows(html) == []
    assert poller(task.id, 2) in html


def test_the_live_view_reloads_the_whole_page_once_the_task_stops(
    signed_in: SignIn, world: World
) -> None:
    # The stop report, phases and audit trail appear only on the whole page: when the
    # task stops, the live view asks htmx for one reload, and that page has no poller.
    task = running(world.queued)
    add_events(task, 2)
    finish(task, "PARTIAL", "no_progress")

    response = signed_in("viewer").get(f"/tasks/{task.id}/live?after=2")

    assert response.status_code == 200
    assert response["HX-Refresh"] == "true"
    assert POLLER not in body(response)
    page = body(signed_in("viewer").get(f"/tasks/{task.id}/"))
    assert "PARTIAL" in page and "no_progress" in page
    assert POLLER not in page


def test_the_live_view_of_a_task_that_is_gone_stops_polling(signed_in: SignIn) -> None:
    response = signed_in("viewer").get("/tasks/987654/live?after=1")

    assert response.status_code == STOP_POLLING


def test_a_finished_task_page_does_not_poll(signed_in: SignIn, world: World) -> None:
    html = body(signed_in("viewer").get(f"/tasks/{world.stopped.id}/"))

    assert POLLER not in html
    assert "/live?" not in html
