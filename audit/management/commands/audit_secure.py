from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from audit.owner import OWNER_ROLE, trail_secure


class Command(BaseCommand):
    help = (
        "Give the audit trail a database owner of its own, apart from the app's role: "
        "afterwards the app's role reads the trail and cannot change it, and schema "
        "changes are recorded. Run as a superuser (DATABASE_URL), once, and again after "
        "a release that changes the trail's functions."
    )

    def add_arguments(self, parser):
        parser.add_argument("--app-role", required=True, help="the role the app connects as")
        parser.add_argument("--owner", default=OWNER_ROLE, help=f"(default {OWNER_ROLE})")

    def handle(self, *args, app_role: str, owner: str, **options):
        with connection.cursor() as cursor:
            cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            if not cursor.fetchone()[0]:
                raise CommandError("audit_secure: connect as a superuser (DATABASE_URL)")
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [app_role])
            if cursor.fetchone() is None:
                raise CommandError(f"--app-role: no role {app_role!r} in this database server")
            if app_role == owner:
                raise CommandError("--app-role: the app's role cannot own the trail")
            with transaction.atomic():
                trail_secure(cursor, app_role=app_role, owner=owner)
        self.stdout.write(f"audit trail owned by {owner}; {app_role} reads it")
