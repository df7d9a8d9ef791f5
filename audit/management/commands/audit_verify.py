import re

from django.core.management.base import BaseCommand, CommandError

from audit.chain import chain_verify


def _expect(value: str) -> tuple[int, str]:
    seq, _, digest = value.partition(":")
    if not re.fullmatch(r"[0-9]+", seq) or not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
        raise CommandError(f"--expect: {value!r} is not SEQ:HASH (a link number, 64 hex digits)")
    return int(seq), digest


class Command(BaseCommand):
    help = (
        "Check the audit trail's hash chain: an entry changed or deleted (and not "
        "archived), a link removed, an entry written around the chain. Prints the head "
        "to write down; exits 1 on any problem."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--expect",
            metavar="SEQ:HASH",
            help="a head printed by an earlier run, which must still be in the chain",
        )

    def handle(self, *args, expect: str | None = None, **options):
        report = chain_verify(expect=None if expect is None else _expect(expect))
        for problem in report.problems:
            self.stderr.write(problem)
        head = f"{report.head_seq}:{report.head_hash}" if report.head_seq else "none"
        self.stdout.write(f"audit trail: {report.links:,} links, head {head}")
        if not report.intact:
            raise CommandError(f"audit trail: {len(report.problems)} problems (the first shown)")
        self.stdout.write("audit trail: intact")
