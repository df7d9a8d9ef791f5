from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from serving.tiny_model import MODEL_NAME, tiny_model_write


class Command(BaseCommand):
    help = "Write the project's tiny Llama (config and tokenizer) for vLLM --load-format dummy."

    def add_arguments(self, parser):
        parser.add_argument(
            "--dir", type=Path, default=Path(settings.VAR_DIR) / "models" / MODEL_NAME
        )

    def handle(self, *args, dir: Path, **options):
        self.stdout.write(f"{MODEL_NAME}: {tiny_model_write(directory=dir)}")
