"""python manage.py tenants list | create SLUG [--name NAME]  (docs/tenants.md)"""

from django.core.management.base import BaseCommand, CommandError

from registry import services
from registry.models import Tenant


class Command(BaseCommand):
    help = "List or create tenants (docs/tenants.md)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="every tenant: slug, agents, clients, name")
        create = sub.add_parser("create", help="create a tenant")
        create.add_argument("slug", help="2 to 40 lowercase letters, digits and hyphens")
        create.add_argument("--name", default="", help="a display name (default: the slug)")

    def handle(self, *args, action: str, **options):
        if action == "create":
            try:
                tenant = services.tenant_create(slug=options["slug"], name=options["name"])
            except services.InvalidInput as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"Created tenant {tenant.slug!r} ({tenant.name}).")
            return
        for tenant in Tenant.objects.order_by("slug"):
            self.stdout.write(f"{tenant.slug}\tagents={tenant.agents.count()}\t"
                              f"clients={tenant.clients.count()}\t{tenant.name}")
