"""``manage.py discovery_schedule``: create (or update) the discovery entries of django-celery-
beat's DatabaseScheduler. Idempotent: run it at every deploy."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand
from django_celery_beat.models import IntervalSchedule, PeriodicTask

ENTRIES = [
    ("discovery-cycle", "discovery.tasks.discovery_cycle_task", "DISCOVERY_INTERVAL_SECONDS"),
    ("discovery-sessions-expire", "discovery.tasks.sessions_expire_task", None),
]


class Command(BaseCommand):
    help = "Create the discovery loop's periodic tasks for celery beat (idempotent)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--interval", type=int, default=None,
                            help="cycle interval in seconds (default DISCOVERY_INTERVAL_SECONDS)")

    def handle(self, *args, **options) -> None:
        cycle = max(1, int(options["interval"] or settings.DISCOVERY_INTERVAL_SECONDS))
        for name, task, setting in ENTRIES:
            every = cycle if setting else max(cycle, 300)
            schedule, _ = IntervalSchedule.objects.get_or_create(
                every=every, period=IntervalSchedule.SECONDS
            )
            _, created = PeriodicTask.objects.update_or_create(
                name=name,
                defaults={
                    "task": task, "interval": schedule, "enabled": True,
                    # expires within the interval: a backlog never piles up
                    "expire_seconds": every,
                },
            )
            verb = "created" if created else "updated"
            self.stdout.write(f"{verb} {name}: {task} every {every}s")
