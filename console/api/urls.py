"""The JSON API's URL map, mounted at ``/api/`` (views in :mod:`console.api.views`).

| method and path | needs | does |
| --- | --- | --- |
| ``GET /api/tasks?state=&reason=&agent=&since=&until=&q=&page=`` | read | one page of tasks |
| ``POST /api/tasks`` | start | start a task (201) |
| ``GET /api/tasks/<id>?after=<seq>`` or ``?before=<seq>`` | read | a task, its trace |
| ``POST /api/tasks/<id>/stop`` | stop | stop it (200, or 202 while it winds down) |
| ``POST /api/tasks/<id>/resume`` | approve | approve a new phase |
| ``GET /api/operations`` | read | the reconciliation queue |
| ``POST /api/operations/<key>/resolve`` | reconcile | mark committed or not committed |
| ``GET /api/approvals?state=`` | read | held calls (default: the pending ones) |
| ``GET /api/approvals/<id>`` | read | one held call and its answer |
| ``POST /api/approvals/<id>/approve`` | approve | run exactly that call in a new phase |
| ``POST /api/approvals/<id>/reject`` | approve | refuse it: the model is told, or the task ends |
| ``POST /api/attached`` | drive | create an attached task, driven by the caller (201) |
| ``POST /api/attached/<id>/steps`` | drive | one step of it (docs/protocol.md) |
| ``GET /api/openapi.json`` | read | this API's OpenAPI 3.1 description (token or session) |

Operation keys may contain slashes, hence the ``path`` converter. A new endpoint is a view
here, a shape in :mod:`console.api.serializers` and an entry in :mod:`console.api.openapi` (the
document is built from this map, and refuses a routed method it has no entry for).
"""

from django.urls import path, re_path

from console.api import views

app_name = "api"

urlpatterns = [
    path("tasks", views.tasks, name="tasks"),
    path("tasks/<int:task_id>", views.task, name="task"),
    path("tasks/<int:task_id>/stop", views.task_stop, name="task-stop"),
    path("tasks/<int:task_id>/resume", views.task_resume, name="task-resume"),
    path("operations", views.operations, name="operations"),
    path("operations/<path:key>/resolve", views.operation_resolve, name="operation-resolve"),
    path("approvals", views.approvals, name="approvals"),
    path("approvals/<int:approval_id>", views.approval, name="approval"),
    path("approvals/<int:approval_id>/approve", views.approval_approve, name="approval-approve"),
    path("approvals/<int:approval_id>/reject", views.approval_reject, name="approval-reject"),
    path("attached", views.attach, name="attached"),
    path("attached/<int:task_id>/steps", views.attached_steps, name="attached-steps"),
    path("openapi.json", views.openapi_document, name="openapi"),
    # Last: anything else under /api/ is a JSON 404 rather than the console's HTML one.
    re_path(r"", views.not_found),
]
