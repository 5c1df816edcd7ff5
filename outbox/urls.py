from django.urls import path

from outbox.api import EventsApi

urlpatterns = [
    path("events", EventsApi.as_view(), name="events"),
]
