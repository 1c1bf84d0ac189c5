"""``manage.py discover --once``: one full discovery cycle with a progress bar and a summary.
Without ``--once`` it runs a cycle every ``--interval`` seconds until interrupted. What to find
comes from the admin's discovery rows and from the file named by ``DISCOVERY_CONFIG``. One
cycle serves every tenant with discovery rows; its summary has a section per tenant (under a
``tenant: <slug>`` line) unless the default tenant is the only one."""

from __future__ import annotations

import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from discovery.loop import run_cycle


class Command(BaseCommand):
    help = (
        "Run the discovery loop: sources, resolver, card cache, matcher, health, snapshot. "
        "It reads the discovery rows edited in the admin and the configuration file named by "
        "the DISCOVERY_CONFIG environment variable (JSON or YAML; e.g. "
        "DISCOVERY_CONFIG=discovery.json manage.py discover --once). --once exits non-zero "
        "when that file is unreadable or malformed."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--once", action="store_true", help="run one cycle and exit")
        parser.add_argument("--interval", type=float, default=None,
                            help="seconds between cycles (default DISCOVERY_INTERVAL_SECONDS)")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")

    def _cycle(self, show_progress: bool) -> str | None:
        bar: tqdm | None = None

        def on_total(total: int) -> None:  # once per tenant the cycle serves
            nonlocal bar
            if bar is not None:
                bar.close()
            if show_progress:
                bar = tqdm(total=total, desc="cards", unit="card", file=self.stderr._out,
                           leave=False, dynamic_ncols=True)

        def progress(n: int) -> None:
            if bar is not None:
                bar.update(n)

        try:
            report = run_cycle(progress=progress, on_total=on_total)
        finally:
            if bar is not None:
                bar.close()
        self.stdout.write(report.summary())
        return report.config_error

    def handle(self, *args, **options) -> None:
        show = not options["no_progress"]
        if options["once"]:
            config_error = self._cycle(show)
            if config_error:
                raise CommandError(f"DISCOVERY_CONFIG {config_error}")
            return
        interval = options["interval"] or settings.DISCOVERY_INTERVAL_SECONDS
        while True:
            self._cycle(show)
            time.sleep(interval)
