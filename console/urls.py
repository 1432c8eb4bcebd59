"""The console's URL map."""

from django.urls import path

from console import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
]
