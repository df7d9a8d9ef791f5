"""A replica's GPUs become shares (whole, MIG instance,
time-sliced). The many-to-many table stays; it gains the share's columns
(every existing row: a whole GPU)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("serving", "0003_roofline_bytes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ReplicaGpu",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "gpu",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="replica_shares",
                                to="serving.gpu",
                            ),
                        ),
                        (
                            "replica",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="gpu_shares",
                                to="serving.replica",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "replica's GPU share",
                        "db_table": "serving_replica_gpus",
                        "unique_together": {("replica", "gpu")},
                    },
                ),
                migrations.AlterField(
                    model_name="replica",
                    name="gpus",
                    field=models.ManyToManyField(
                        blank=True,
                        related_name="replicas",
                        through="serving.ReplicaGpu",
                        to="serving.gpu",
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.AddField(
            model_name="gpusku",
            name="mig_capable",
            field=models.BooleanField(
                default=False,
                help_text="Can be partitioned into MIG instances (A100, H100, H200).",
            ),
        ),
        migrations.AddField(
            model_name="replicagpu",
            name="sharing",
            field=models.CharField(
                choices=[
                    ("whole", "Whole GPU"),
                    ("mig", "MIG instance"),
                    ("time_sliced", "Time-sliced share"),
                ],
                default="whole",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="replicagpu",
            name="mig_profile",
            field=models.CharField(blank=True, default="", max_length=20),
        ),
        migrations.AddField(
            model_name="replicagpu",
            name="mig_instance",
            field=models.PositiveSmallIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="replicagpu",
            name="share_percent",
            field=models.PositiveSmallIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="replicagpu",
            name="units",
            field=models.PositiveIntegerField(default=700),
        ),
        migrations.AddConstraint(
            model_name="replicagpu",
            constraint=models.UniqueConstraint(
                condition=models.Q(("sharing", "mig")),
                fields=("gpu", "mig_instance"),
                name="replica_gpu_mig_instance_once",
            ),
        ),
        migrations.AddConstraint(
            model_name="replicagpu",
            constraint=models.CheckConstraint(
                condition=models.Q(("units__gt", 0), ("units__lte", 700)),
                name="replica_gpu_units",
            ),
        ),
    ]
