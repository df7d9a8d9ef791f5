"""A window's GPUs in GPU units (700 to a GPU), as a replica may
hold a MIG instance or a time-sliced share of one."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("metering", "0002_gateway_queue_ms"),
    ]

    operations = [
        migrations.RenameField(model_name="attributionwindow", old_name="gpus", new_name="gpu_units"),
        migrations.RunSQL(
            "UPDATE metering_attributionwindow SET gpu_units = gpu_units * 700",
            "UPDATE metering_attributionwindow SET gpu_units = gpu_units / 700",
        ),
    ]
