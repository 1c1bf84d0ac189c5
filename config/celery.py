"""The Celery app. Distributed mode uses Redis as broker; embedded mode runs tasks in-process.

Beat's scheduler (``node.beat.ResilientDatabaseScheduler``) survives database and broker
outages; see that module.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("agent_registry")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
