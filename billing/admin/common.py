"""Shared by the admins: read-only records, and a form refused with the
service's own message."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db import connection, transaction
from django.http import HttpResponseRedirect

from billing.errors import (
    TermsDatedError,
)
from core.errors import ConflictError, InputError


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class DryRun(Exception):
    """Rolls back a service run only to see what it refuses."""


def service_refusal(form: forms.Form, run) -> None:
    """Run a write service inside a savepoint rolled back, so the form
    refuses what the service would (its error on the field it names, a
    409's message on the form), with the very checks the save makes."""
    # The audit trail names who wrote from the transaction's first write on
    # (audit.context sets it then, on the session); were that write the
    # dry run's, the rollback would take the name with it and the real
    # save would be recorded as nobody's. A statement that is not a read
    # sets it first, outside the savepoint.
    with connection.cursor() as cursor:
        cursor.execute("VALUES (1)")
    try:
        with transaction.atomic():
            run()
            raise DryRun
    except DryRun:
        pass
    except InputError as error:
        field = error.field if error.field in form.fields else None
        form.add_error(field, error.message)
    except TermsDatedError as error:
        field = error.field if error.field in form.fields else None
        form.add_error(field, str(error).removeprefix(f"{error.field}: "))
    except ConflictError as error:
        form.add_error(None, str(error))


class VersionedAdmin(admin.ModelAdmin):
    """A row that has taken effect (`frozen`) is shown read-only; a POST
    changing it is refused with the service's message, never saved."""

    def frozen(self, obj) -> ConflictError | None:
        raise NotImplementedError

    def refusal(self, request, obj) -> ConflictError | None:
        return None if obj is None else self.frozen(obj)

    def get_readonly_fields(self, request, obj=None):
        if self.refusal(request, obj) is not None:
            return [f.name for f in self.model._meta.fields]
        return super().get_readonly_fields(request, obj)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        obj = self.get_object(request, object_id) if object_id else None
        refusal = self.refusal(request, obj)
        if refusal is not None:
            if request.method == "POST":
                self.message_user(request, str(refusal), messages.ERROR)
                return HttpResponseRedirect(request.path)
            self.message_user(request, self.frozen_note(obj, refusal), messages.WARNING)
        return super().changeform_view(request, object_id, form_url, extra_context)

    def frozen_note(self, obj, refusal: ConflictError) -> str:
        return f"Read-only: {refusal}"
