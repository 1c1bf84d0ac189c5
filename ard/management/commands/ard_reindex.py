"""``manage.py ard_reindex``: rebuild the ARD search index from the registry."""

from django.core.management.base import BaseCommand

from ard.documents import check_settings
from ard.indexer import index_rebuild


class Command(BaseCommand):
    help = "Rebuild the ARD search index from the registry (and drop orphaned documents)."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--changed",
            action="store_true",
            help="only agents whose card changed since they were indexed",
        )

    def handle(self, *args, changed: bool = False, **options) -> None:
        for problem in check_settings():
            self.stderr.write(f"warning: {problem}")
        result = index_rebuild(force=not changed)
        self.stdout.write(
            f"indexed {result['indexed']} of {result['agents']} agent(s), "
            f"pruned {result['pruned']} orphaned document(s)"
        )
