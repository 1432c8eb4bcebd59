"""The console's URL map."""

from django.contrib.auth import views as auth_views
from django.urls import include, path

from console.web import metrics, notification_views, views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("tasks/", views.task_list, name="tasks"),
    path("tasks/new", views.task_new, name="task-new"),
    path("tasks/bulk", views.task_bulk, name="task-bulk"),
    path("tasks/<int:task_id>/", views.task_detail, name="task"),
    path("tasks/<int:task_id>/live", views.task_live, name="task-live"),
    path("tasks/<int:task_id>/report.json", views.task_report_json, name="task-report"),
    path("tasks/<int:task_id>/stop", views.task_stop, name="task-stop"),
    path("tasks/<int:task_id>/resume", views.task_resume, name="task-resume"),
    path("operations/", views.operations, name="operations"),
    path("operations/<path:key>/resolve", views.operation_resolve, name="operation-resolve"),
    path("operations/<path:key>/lookup", views.operation_lookup, name="operation-lookup"),
    path("approvals/", views.approvals, name="approvals"),
    path("approvals/<int:approval_id>/answer", views.approval_answer, name="approval-answer"),
    path("audit/", views.audit, name="audit"),
    path("audit.<str:fmt>", views.audit_export, name="audit-export"),
    path("notifications/", notification_views.notifications_page, name="notifications"),
    path("notifications/channels", notification_views.channel_add, name="notification-add"),
    path(
        "notifications/<int:channel_id>/test",
        notification_views.channel_test,
        name="notification-test",
    ),
    path(
        "notifications/<int:channel_id>/remove",
        notification_views.channel_remove,
        name="notification-remove",
    ),
    path("login", auth_views.LoginView.as_view(), name="login"),
    path("logout", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("api/", include("console.api.urls")),
]
