"""python manage.py clients list | revoke CLIENT_ID | rotate CLIENT_ID

The command-line twin of the admin's API client page: list clients with their last gateway
call, revoke one for good, or rotate its token (the new token is the last line of output; the
old one stops working).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count, Max, OuterRef, Subquery

from console import services as console_services
from console.models import ClientUsage
from registry import services
from registry.models import ApiClient
from registry.permissions import Actor


def _cli_actor() -> Actor:
    import getpass

    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = "unknown"
    return Actor(client_id=f"cli:{user}", scopes=frozenset({"admin"}))


class Command(BaseCommand):
    help = "List API clients, revoke one, or rotate its token (new token printed last)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="every client, its scopes and last gateway call")
        listing.add_argument("--all", action="store_true", help="include revoked clients")
        revoke = sub.add_parser("revoke", help="revoke a client for good")
        revoke.add_argument("client_id")
        rotate = sub.add_parser("rotate", help="new token for a client; the old one is revoked")
        rotate.add_argument("client_id")

    def handle(self, *args, action: str, **options):
        if action == "list":
            self._list(include_revoked=options["all"])
            return
        client_id = options["client_id"]
        try:
            if action == "revoke":
                client = ApiClient.objects.filter(client_id=client_id).first()
                if client is None:
                    raise services.InvalidInput(f"no client {client_id!r}")
                if client.revoked:
                    raise services.InvalidInput(f"{client_id} is revoked already")
                console_services.client_revoke(client_id=client_id, actor=_cli_actor())
                self.stdout.write(f"Revoked {client_id}.")
            else:
                token = console_services.client_rotate(client_id=client_id, actor=_cli_actor())
                self.stderr.write(
                    f"Rotated the token of {client_id!r}; the old token no longer works (caches "
                    "forget it within A2A_AUTH_CACHE_SECONDS). Keep the token below: it is "
                    "stored hashed and not shown again."
                )
                self.stdout.write(token)
        except services.InvalidInput as exc:
            raise CommandError(str(exc)) from None

    def _list(self, *, include_revoked: bool) -> None:
        last = (
            ClientUsage.objects.filter(client_id=OuterRef("client_id"))
            .order_by()
            .values("client_id")
            .annotate(t=Max("last_used_at"))
            .values("t")
        )
        clients = ApiClient.objects.annotate(
            agent_count=Count("agents"), last_used=Subquery(last)
        ).order_by("client_id")
        if not include_revoked:
            clients = clients.filter(revoked=False)
        header = f"{'client_id':<30} {'scopes':<22} {'agents':>6} {'state':<8} last gateway call"
        self.stdout.write(header)
        for c in clients:
            state = "revoked" if c.revoked else ("expired" if c.has_expired else "active")
            used = c.last_used.strftime("%Y-%m-%d %H:%M:%S") if c.last_used else "never"
            self.stdout.write(
                f"{c.client_id:<30} {','.join(c.scopes or []):<22} "
                f"{c.agent_count:>6} {state:<8} {used}"
            )
