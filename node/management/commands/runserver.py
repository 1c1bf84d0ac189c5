"""``manage.py runserver`` refuses and points to ``manage.py serve``.

Django's development server (and Daphne's ``runserver``, which replaces it) would start a
process serving Django's views without the node around them: no Subscriber Manager, no routing
table fed by registry events, no periodic jobs. It would answer on its port, register itself as
a node and linger on the dashboard as a dead one. A node is started with ``manage.py serve``
(``scripts/run.sh`` sets everything up and runs it). This app is listed before ``daphne`` in
``INSTALLED_APPS`` so this command is the one ``manage.py`` finds.
"""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError

MESSAGE = (
    "runserver does not run this platform: it would serve Django alone, without the gateway "
    "node (routing table, virtual subscribers, periodic jobs). Start a node with\n"
    "    python manage.py serve [--host HOST] [--port PORT] [--server daphne|uvicorn]\n"
    "or scripts/run.sh, which sets everything up and runs it."
)


class Command(BaseCommand):
    help = "Refuses: this platform runs with `manage.py serve` (see its help)."

    def run_from_argv(self, argv: list[str]) -> None:
        # Whatever the arguments (an address, --noreload, ...): the answer is the same.
        sys.stderr.write(MESSAGE + "\n")
        sys.exit(2)

    def handle(self, *args, **options) -> None:
        raise CommandError(MESSAGE, returncode=2)
